package main

import (
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/ctxpipe/ctxpipe"
	"github.com/ctxpipe/ctxpipe/bus"
)

// ServiceUser is the nats.conf user the service connects as.
const ServiceUser = "ctxpipe"

// embeddedOptions are the embedded server's options: nats.conf (the copy
// compiled into the binary, ctxpipe.NATSConf) with its accounts, users and
// limits as they are, and only what must differ from a standalone server
// changed: the name, where JetStream stores (under --data-dir), no
// monitoring port, and the client listener on --listen, which must be a
// loopback address ("" listens nowhere: in-process clients only). The demo
// passwords in nats.conf are public, so the embedded server never serves
// them to the network; a deployment runs nats-server with its own file.
func embeddedOptions(dataDir, listen string) (*server.Options, error) {
	opts := &server.Options{}
	if err := opts.ProcessConfigString(ctxpipe.NATSConf); err != nil {
		return nil, fmt.Errorf("nats.conf: %w", err)
	}
	opts.ServerName = "ctxpipe-embedded"
	opts.StoreDir = filepath.Join(dataDir, "nats")
	opts.HTTPHost, opts.HTTPPort, opts.HTTPSPort = "", 0, 0
	opts.NoSigs = true
	opts.DontListen = listen == ""
	if listen == "" {
		return opts, nil
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("--listen %q: %w", listen, err)
	}
	if !loopback(host) {
		return nil, fmt.Errorf("--listen %q: the embedded server listens on loopback only (its users have the demo passwords of nats.conf); run nats-server -c with real passwords and --nats-url to serve a network", listen)
	}
	opts.Host = host
	if opts.Port, err = strconv.Atoi(port); err != nil {
		return nil, fmt.Errorf("--listen %q: bad port", listen)
	}
	return opts, nil
}

// loopback reports whether host names only this machine: localhost, or a
// loopback IP (127.0.0.0/8, ::1).
func loopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// servicePassword is the password the service logs in to the embedded
// server with: --nats-password when given, else the one nats.conf writes
// for the ctxpipe user, unless that is a bcrypt hash, which cannot be
// logged in with.
func servicePassword(opts *server.Options, flag string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	for _, u := range opts.Users {
		if u.Username != ServiceUser {
			continue
		}
		if strings.HasPrefix(u.Password, "$2") {
			return "", fmt.Errorf("nats.conf has a bcrypt hash as the %s user's password: pass the password with --nats-password", ServiceUser)
		}
		return u.Password, nil
	}
	return "", fmt.Errorf("nats.conf has no user %s", ServiceUser)
}

// startEmbedded starts the NATS server in process with nats.conf's accounts
// and users (embeddedOptions) and connects the service to it in process as
// the ctxpipe user, with the same connection settings as against a
// standalone server. It sets m.ns and m.nc; Close shuts both down.
func (m *Main) startEmbedded() error {
	c := m.Config
	opts, err := embeddedOptions(c.DataDir, c.Listen)
	if err != nil {
		return err
	}
	password, err := servicePassword(opts, c.NATS.Password)
	if err != nil {
		return err
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return fmt.Errorf("embedded nats server: %w", err)
	}
	ns.SetLoggerV2(natsLogger{m.Log}, false, false, false)
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return fmt.Errorf("embedded nats server did not start on %s (is the port taken? use --listen or --nats-url)", c.Listen)
	}
	cfg := bus.ConnConfig{User: ServiceUser, Password: password, InboxPrefix: c.NATS.InboxPrefix, Name: "ctxpipe-consumer", Log: m.Log}
	if !opts.DontListen {
		// Only for the logs: an in-process connection dials nothing.
		cfg.URL = ns.ClientURL()
	}
	nc, err := bus.Connect(cfg, nats.InProcessServer(ns))
	if err != nil {
		ns.Shutdown()
		return fmt.Errorf("connect to the embedded server: %w", err)
	}
	m.ns, m.nc = ns, nc
	return nil
}

// natsLogger sends the embedded server's notices and errors to slog.
type natsLogger struct{ l *slog.Logger }

func (n natsLogger) Noticef(format string, v ...any) { n.l.Debug("nats: " + fmt.Sprintf(format, v...)) }
func (n natsLogger) Warnf(format string, v ...any)   { n.l.Warn("nats: " + fmt.Sprintf(format, v...)) }
func (n natsLogger) Fatalf(format string, v ...any)  { n.l.Error("nats: " + fmt.Sprintf(format, v...)) }
func (n natsLogger) Errorf(format string, v ...any)  { n.l.Error("nats: " + fmt.Sprintf(format, v...)) }
func (n natsLogger) Debugf(format string, v ...any)  { n.l.Debug("nats: " + fmt.Sprintf(format, v...)) }
func (n natsLogger) Tracef(format string, v ...any)  {}
