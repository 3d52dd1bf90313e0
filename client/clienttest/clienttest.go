// Package clienttest runs the real ctxpipe service in process, for the tests
// and examples of code that talks to it through package client: an embedded
// JetStream server, a SQLite file, the engine with the offline condenser (or
// a summarizer the test gives), the runner, the outbox relay and the query
// responders, as cmd/consumer wires them. Nothing is mocked.
//
// It is a test helper (like net/http/httptest): Start needs no *testing.T,
// so runnable examples can use it too; New is Start for a test.
package clienttest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/condense"
	"github.com/ctxpipe/ctxpipe/engine"
	"github.com/ctxpipe/ctxpipe/pipeline"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/store"
)

// SmallProfile is the profile of conversations that name none: a 4,000-token
// window with 400 reserved for the reply (3,200 allowed), so that a dozen
// short turns cross the 75 % threshold (3,000 tokens) and condense.
func SmallProfile(id string) schema.Profile {
	return schema.Profile{ID: id, ContextWindow: 4000, MaxTokens: 400}
}

// Threshold is the service's global condense threshold, in percent.
const Threshold = 75

// Option configures Start.
type Option func(*config)

type config struct {
	profiles   []schema.Profile
	summarizer engine.Summarizer
	log        *slog.Logger
	maxPayload int32
	conn       *bus.ConnConfig
}

// WithProfiles replaces the profiles (default: SmallProfile("default")).
func WithProfiles(ps ...schema.Profile) Option {
	return func(c *config) { c.profiles = ps }
}

// WithSummarizer condenses with s instead of the offline condenser, for
// tests that need a condense to fail or to take its time.
func WithSummarizer(s engine.Summarizer) Option {
	return func(c *config) { c.summarizer = s }
}

// WithLog sends the service's log lines to log (default: discarded).
func WithLog(log *slog.Logger) Option {
	return func(c *config) { c.log = log }
}

// WithMaxPayload sets the server's max_payload (default bus.MaxMsgSize),
// which also bounds the service's query replies: tests of replies too large
// for one message need no megabytes of data.
func WithMaxPayload(n int32) Option {
	return func(c *config) { c.maxPayload = n }
}

// WithConn runs the service against a server that is already there (for
// example one started from the repository's nats.conf, with its accounts
// and users), connected with cfg, instead of an embedded server of its own.
// WithMaxPayload then does nothing.
func WithConn(cfg bus.ConnConfig) Option {
	return func(c *config) { c.conn = &cfg }
}

// Service is a running ctxpipe.
type Service struct {
	// URL is the NATS server's client URL.
	URL string
	// NATS is the embedded server, for tests that stop or restart it (nil
	// with WithConn).
	NATS *server.Server
	// Store is the service's SQLite store.
	Store *store.Store

	cfg    config
	nc     *nats.Conn
	relay  *store.Relay
	dir    string
	cancel context.CancelFunc
	stopQ  func() error
	done   []chan error
}

// Start runs a service in a temporary directory; Close stops it and removes
// the directory.
func Start(ctx context.Context, opts ...Option) (_ *Service, err error) {
	c := config{profiles: []schema.Profile{SmallProfile(schema.DefaultProfileID)}, log: slog.New(slog.DiscardHandler), maxPayload: bus.MaxMsgSize}
	for _, o := range opts {
		o(&c)
	}
	dir, err := os.MkdirTemp("", "ctxpipe-clienttest-")
	if err != nil {
		return nil, fmt.Errorf("clienttest: %w", err)
	}
	s := &Service{cfg: c, dir: dir}
	defer func() {
		if err != nil {
			_ = s.Close()
		}
	}()
	if c.conn == nil {
		if err := s.startNATS(-1); err != nil {
			return nil, err
		}
	}
	if err := s.start(ctx, nil); err != nil {
		return nil, err
	}
	return s, nil
}

// startNATS starts the embedded server on port (-1: any free one), with
// its JetStream store in the service's directory.
func (s *Service) startNATS(port int) (err error) {
	s.NATS, err = server.NewServer(&server.Options{
		ServerName: "clienttest", Host: "127.0.0.1", Port: port,
		JetStream: true, StoreDir: filepath.Join(s.dir, "jetstream"),
		MaxPayload: s.cfg.maxPayload, NoLog: true, NoSigs: true,
	})
	if err != nil {
		return fmt.Errorf("clienttest: nats server: %w", err)
	}
	go s.NATS.Start()
	// Readiness is not a timed assertion: 30 s only bounds a broken start.
	if !s.NATS.ReadyForConnections(30 * time.Second) {
		return errors.New("clienttest: nats server not ready for connections")
	}
	s.URL = s.NATS.ClientURL()
	return nil
}

// start runs the service against the server, on the store in its
// directory. whileDown, if not nil, runs once the service is connected
// but before it answers queries or consumes inputs.
func (s *Service) start(ctx context.Context, whileDown func()) (err error) {
	c := s.cfg
	if c.conn != nil {
		cfg := *c.conn
		if cfg.Name == "" {
			cfg.Name = "clienttest-service"
		}
		if cfg.Log == nil {
			cfg.Log = c.log
		}
		s.URL = cfg.URL
		if s.nc, err = bus.Connect(cfg); err != nil {
			return fmt.Errorf("clienttest: %w", err)
		}
	} else if s.nc, err = nats.Connect(s.URL, nats.Name("clienttest-service"), nats.MaxReconnects(-1)); err != nil {
		return fmt.Errorf("clienttest: connect: %w", err)
	}
	js, err := jetstream.New(s.nc)
	if err != nil {
		return fmt.Errorf("clienttest: %w", err)
	}
	if err := bus.EnsureStreams(ctx, js); err != nil {
		return fmt.Errorf("clienttest: %w", err)
	}
	if s.Store, err = store.Open(ctx, filepath.Join(s.dir, "ctxpipe.db")); err != nil {
		return fmt.Errorf("clienttest: %w", err)
	}
	summarizer := c.summarizer
	if summarizer == nil {
		summarizer = condense.NewRouter(condense.Config{}, c.log) // no endpoint: the offline condenser
	}
	eng := engine.NewEngine(summarizer)
	eng.Globals = schema.Globals{AutoCondense: true, AutoCondensePercent: Threshold}
	eng.Log = c.log
	eng.Progress = pipeline.ProgressPublisher(js, c.log)
	s.relay = store.NewRelay(s.Store, pipeline.JetStreamPublisher{JS: js}, c.log, store.RelayOptions{PollInterval: 20 * time.Millisecond})
	r, err := pipeline.New(pipeline.Config{Lanes: 4, AckWait: 5 * time.Second, MaxDeliver: 5, RetryBudget: time.Second}, pipeline.Deps{
		JS: js, Store: s.Store, Engine: eng, Profiles: pipeline.StaticProfiles(c.profiles...),
		Relay: s.relay, Log: c.log, Metrics: pipeline.NewMetrics(),
	})
	if err != nil {
		return fmt.Errorf("clienttest: %w", err)
	}
	if whileDown != nil {
		whileDown()
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel = cancel
	if s.stopQ, err = r.ServeQueries(runCtx, s.nc); err != nil {
		return fmt.Errorf("clienttest: serve queries: %w", err)
	}
	// The responders' subscriptions must be at the server before Start
	// returns, or a first query may find no responders.
	if err := s.nc.FlushTimeout(30 * time.Second); err != nil {
		return fmt.Errorf("clienttest: %w", err)
	}
	relayDone, runDone := make(chan error, 1), make(chan error, 1)
	s.done = []chan error{runDone, relayDone}
	go func() { relayDone <- s.relay.Run(runCtx) }()
	go func() { runDone <- r.Run(runCtx) }()
	return nil
}

// Restart stops the service as a graceful shutdown does (queries still
// waiting are answered internal, then the embedded server shuts down) and
// starts it again on the same store, streams and port, so that clients
// reconnect to it. whileDown, if not nil, runs once the server is back
// but before the service answers queries or consumes inputs: the moment
// in which an embedded deployment's clients reconnect and find no
// responders. With WithConn only the service restarts.
func (s *Service) Restart(ctx context.Context, whileDown func()) error {
	port := -1
	if s.NATS != nil {
		port = s.NATS.Addr().(*net.TCPAddr).Port
	}
	if err := s.stop(); err != nil {
		return err
	}
	if s.cfg.conn == nil {
		if err := s.startNATS(port); err != nil {
			return err
		}
	}
	return s.start(ctx, whileDown)
}

// New starts a service for t and stops it when t ends.
func New(t testing.TB, opts ...Option) *Service {
	t.Helper()
	s, err := Start(t.Context(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("clienttest: close: %v", err)
		}
	})
	return s
}

// WaitConsuming returns once the service has made all its partitions'
// consumers on CTX_IN (it makes them as it starts, after Start returns). A
// test that changes CTX_IN's configuration waits for this first:
// nats-server races a stream update with a consumer being made on it.
func (s *Service) WaitConsuming(ctx context.Context) error {
	js, err := jetstream.New(s.nc)
	if err != nil {
		return fmt.Errorf("clienttest: %w", err)
	}
	for {
		st, err := js.Stream(ctx, bus.StreamIn)
		if err != nil {
			return fmt.Errorf("clienttest: %w", err)
		}
		want := bus.PartitionsOf(st.CachedInfo().Config) + 1 // and the shared one
		if st.CachedInfo().State.Consumers >= want {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("clienttest: %d of %d partition consumers on %s: %w", st.CachedInfo().State.Consumers, want, bus.StreamIn, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Flush returns once every event committed so far is published, so that a
// test that reads them afterwards misses none.
func (s *Service) Flush(ctx context.Context) error { return s.relay.Flush(ctx) }

// Close stops the service and removes its directory. It may be called more
// than once.
func (s *Service) Close() error {
	err := s.stop()
	if s.dir != "" {
		err = errors.Join(err, os.RemoveAll(s.dir))
		s.dir = ""
	}
	return err
}

// stop stops the service and the embedded server, keeping the directory.
func (s *Service) stop() error {
	var errs []error
	if s.cancel != nil {
		s.cancel()
		for _, d := range s.done {
			if err := <-d; err != nil && !errors.Is(err, context.Canceled) {
				errs = append(errs, err)
			}
		}
		s.cancel, s.done = nil, nil
	}
	if s.stopQ != nil {
		_ = s.stopQ() // a drain of subscriptions the closing connection ends anyway
		s.stopQ = nil
	}
	if s.Store != nil {
		errs = append(errs, s.Store.Close())
		s.Store = nil
	}
	if s.nc != nil {
		s.nc.Close()
		s.nc = nil
	}
	if s.NATS != nil {
		s.NATS.Shutdown()
		s.NATS.WaitForShutdown()
		s.NATS = nil
	}
	return errors.Join(errs...)
}
