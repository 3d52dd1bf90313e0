// Command consumer is the ctxpipe service. With no flags it runs on embedded
// defaults: an in-process NATS server with JetStream (listening on
// 127.0.0.1:4222 so clients and the nats CLI can connect), a SQLite file and
// the offline condenser, all under ./data. --nats-url connects to an
// external server instead.
//
// config.go is the configuration and its flags; service.go (Main) starts
// the service in order and stops it in reverse; embedded.go runs the
// in-process NATS server, stores.go opens the SQLite files and their outbox
// relays, dirlock.go keeps a data directory to one process, http.go serves
// the dashboard, /metrics, /healthz and /readyz, memory.go sets the Go
// heap's soft limit, and rebuild.go (--rebuild) rebuilds the SQLite file
// from CTX_STATE and proves them identical.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	m := NewMain()
	if err := m.ParseFlags(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		os.Exit(2)
	}
	limit, source := applyMemoryLimit(m.Config)
	m.MemoryLimit = mib(limit) + " (" + source + ")"
	if m.Config.Rebuild {
		if err := m.RebuildDB(ctx, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "consumer: rebuild:", err)
			os.Exit(1)
		}
		return
	}
	if err := m.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		_ = m.Close()
		os.Exit(1)
	}
	code := 0
	select {
	case <-ctx.Done():
	case err := <-m.Failed():
		// Never stay up doing nothing: exit non-zero so that a supervisor
		// restarts the service.
		fmt.Fprintln(os.Stderr, "consumer:", err)
		code = 1
	}
	stop() // a second signal now kills the process at once
	if err := m.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "consumer: shutdown:", err)
		os.Exit(1)
	}
	os.Exit(code)
}
