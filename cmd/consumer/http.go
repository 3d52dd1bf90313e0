package main

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ctxpipe/ctxpipe/dashboard"
)

func (m *Main) serveHTTP(dd dashboard.Deps) error {
	if m.Config.HTTP == "" {
		return nil
	}
	mux := http.NewServeMux()
	// The dashboard at /: it acts with the service's own connection and sees
	// every tenant, so it is only as open as this listener (loopback by
	// default); the more specific paths below win over it.
	d, err := dashboard.New(dd)
	if err != nil {
		return fmt.Errorf("dashboard: %w", err)
	}
	mux.Handle("/", d)
	// The metrics and the profiles answer only to the dashboard's names
	// (a rebinding site's page could read them otherwise); /healthz and
	// /readyz answer any name a supervisor or a load balancer uses.
	mux.Handle("/metrics", d.Guard(m.metrics.Handler()))
	// Profiles of a running service; the listener is loopback by default.
	// Not /debug/pprof/cmdline: it would show a --nats-password given on
	// the command line.
	mux.Handle("/debug/pprof/", d.Guard(http.HandlerFunc(pprof.Index)))
	mux.Handle("/debug/pprof/profile", d.Guard(http.HandlerFunc(pprof.Profile)))
	mux.Handle("/debug/pprof/symbol", d.Guard(http.HandlerFunc(pprof.Symbol)))
	mux.Handle("/debug/pprof/trace", d.Guard(http.HandlerFunc(pprof.Trace)))
	// /healthz: the process is alive and its SQLite file answers. A
	// supervisor restarts the process when this fails.
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if _, err := m.stores.ConversationCount(r.Context()); err != nil {
			http.Error(w, "sqlite: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	// /readyz: the service is consuming: connected to NATS, its consumer
	// exists and was heard from recently. A load balancer or an operator
	// looks here; it goes unready while a node loss makes consuming
	// impossible and ready again once the runner has rebuilt its consumer.
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		ok, why := m.Ready()
		if !ok {
			http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready:", why)
	})
	ln, err := net.Listen("tcp", m.Config.HTTP)
	if err != nil {
		return fmt.Errorf("--http %s: %w", m.Config.HTTP, err)
	}
	m.httpAddr = ln.Addr().String()
	// No WriteTimeout: the dashboard's event streams stay open.
	m.http = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	m.http.RegisterOnShutdown(d.Close)
	go func() {
		if err := m.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			m.Log.Error("http server", "err", err)
		}
	}()
	return nil
}

// HTTPAddr is the address /metrics, /healthz and /readyz listen on ("" when
// disabled); with --http 127.0.0.1:0 it says which port was picked.
func (m *Main) HTTPAddr() string { return m.httpAddr }

// Ready tells whether the service is consuming, and why not.
func (m *Main) Ready() (bool, string) {
	if st := m.nc.Status(); st != nats.CONNECTED {
		return false, "nats: " + st.String()
	}
	return m.runner.Ready()
}
