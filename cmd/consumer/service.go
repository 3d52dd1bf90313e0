package main

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/condense"
	"github.com/ctxpipe/ctxpipe/dashboard"
	"github.com/ctxpipe/ctxpipe/engine"
	"github.com/ctxpipe/ctxpipe/internal/backoff"
	"github.com/ctxpipe/ctxpipe/pipeline"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/store"
	"github.com/ctxpipe/ctxpipe/tokens"
)

//go:embed profiles.json
var defaultProfiles []byte

// relayPoll is how often the outbox relay looks for events without being
// woken.
const relayPoll = 2 * time.Second

// Main is the running service: what it opened, so Close can undo it in order.
type Main struct {
	Config Config
	Log    *slog.Logger
	// MemoryLimit says, for the start log, what main set the runtime's
	// memory limit to and why ("" when it set none).
	MemoryLimit string

	ns          *server.Server
	nc          *nats.Conn
	stores      *store.Set
	relays      relays
	runner      *pipeline.Runner
	metrics     *pipeline.Metrics
	http        *http.Server
	queries     func() error
	cancel      context.CancelFunc
	cancelRelay context.CancelFunc
	runDone     chan error
	relayEnd    chan error

	failed   chan error
	httpAddr string

	closeOnce sync.Once
	closeErr  error
	// unlockDir releases the data dir (lockDataDir).
	unlockDir func()
}

// NewMain returns a Main with the default configuration.
func NewMain() *Main { return &Main{Config: DefaultConfig()} }

// Run starts the service and returns once it is consuming.
func (m *Main) Run(ctx context.Context) error {
	c := m.Config
	if m.Log == nil {
		m.Log = m.logger()
	}
	log := m.Log
	if m.Config.Name == "" {
		m.Config.Name = defaultName(c.DataDir)
	}
	m.failed = make(chan error, 1)
	if err := os.MkdirAll(c.DataDir, 0o755); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	unlock, err := lockDataDir(c.DataDir)
	if err != nil {
		return err
	}
	m.unlockDir = unlock
	if err := m.connect(ctx); err != nil {
		return err
	}
	js, err := jetstream.New(m.nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	// Each start step waits out a cluster without quorum (it says so)
	// rather than failing the start.
	busOpts := []bus.Option{bus.WithReplicas(c.Replicas), bus.WithLogger(log)}
	if c.Partitions != bus.DefaultPartitions {
		// Asked for: a stream that keeps another N is warned about. The
		// default is not a request (a stream made when it was 64 keeps 64
		// quietly).
		busOpts = append(busOpts, bus.WithPartitions(c.Partitions))
	}
	if err := bus.RetryStart(ctx, log, "ensure streams", func(ctx context.Context) error {
		return bus.EnsureStreams(ctx, js, busOpts...)
	}); err != nil {
		return err
	}
	var kv jetstream.KeyValue
	if err := bus.RetryStart(ctx, log, "ensure the profiles bucket", func(ctx context.Context) (err error) {
		kv, err = bus.EnsureProfiles(ctx, js, busOpts...)
		return err
	}); err != nil {
		return err
	}
	seed, err := m.seedProfiles()
	if err != nil {
		return err
	}
	// A bucket just created on a fresh cluster may not answer yet: waited
	// out like the steps before.
	if err := bus.RetryStart(ctx, log, "seed the profiles", func(ctx context.Context) error {
		return pipeline.SeedProfiles(ctx, kv, seed)
	}); err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	m.cancel = cancel
	// The watch lives as long as the service (runCtx); its start is
	// retried like the steps before, since an instance restarted while a
	// node comes back may find the bucket without a leader for a while.
	reconnected := m.nc.StatusChanged(nats.CONNECTED)
	var profiles *pipeline.Profiles
	if err := bus.RetryStart(ctx, log, "watch the profiles", func(context.Context) (err error) {
		profiles, err = pipeline.WatchProfiles(runCtx, kv, log, reconnected)
		return err
	}); err != nil {
		return err
	}
	members, err := m.lock(ctx, js, runCtx)
	if err != nil {
		return err
	}
	if m.stores, err = openStores(ctx, c.DataDir, c.StoreFiles, log); err != nil {
		return err
	}
	m.metrics = pipeline.NewMetrics()
	// The tokenizer's vocabulary loads on first use (about 0.3 s of CPU):
	// here, rather than in the first inputs' commit latency.
	if _, err := tokens.O200K(); err != nil {
		return err
	}
	llmCfg := condense.ConfigFromEnv()
	eng := engine.NewEngine(condense.NewRouter(llmCfg, log))
	eng.Globals, eng.Log = c.Globals, log
	eng.Progress = pipeline.ProgressPublisher(js, log)
	// Every commit that stores events wakes its file's relay (Notify), so
	// their poll is only a safety net: every 2 s rather than the default
	// 250 ms, so that an idle instance reads each file's outbox seldom.
	for _, st := range m.stores.Files() {
		m.relays = append(m.relays, store.NewRelay(st, pipeline.JetStreamPublisher{JS: js}, log, store.RelayOptions{
			DuplicateWindow: bus.DuplicateWindow, PollInterval: relayPoll}))
	}
	pcfg := c.Pipeline
	pcfg.Name = m.Config.Name
	m.runner, err = pipeline.New(pcfg, pipeline.Deps{
		JS: js, Stores: m.stores, Engine: eng, Profiles: profiles, Relays: m.relays, Log: log, Metrics: m.metrics,
		Members: members,
	})
	if err != nil {
		return err
	}
	m.metrics.Gauge("ctxpipe_outbox_pending", "Events committed but not yet published.", func(ctx context.Context) (float64, error) {
		n, err := m.relays.Pending(ctx)
		return float64(n), err
	})
	m.metrics.Gauge("ctxpipe_outbox_skipped", "Events the relay gave up on since start because they can never be published (larger than the server or CTX_EVENTS takes); they stay stored.", func(context.Context) (float64, error) {
		return float64(m.relays.Skipped()), nil
	})
	m.metrics.Gauge("ctxpipe_inputs_held", "Inputs fetched and not yet acked (queued for their conversation or being applied).", func(context.Context) (float64, error) {
		return float64(m.runner.Held()), nil
	})
	m.metrics.Gauge("ctxpipe_conversations", "Conversations stored.", func(ctx context.Context) (float64, error) {
		n, err := m.stores.ConversationCount(ctx)
		return float64(n), err
	})
	if m.queries, err = m.runner.ServeQueries(runCtx, m.nc); err != nil {
		return fmt.Errorf("serve queries: %w", err)
	}
	for _, st := range m.stores.Files() {
		go store.RunPruner(runCtx, st, c.PruneEvery, c.Retention, log)
	}
	// The relay outlives the runner: Close flushes it after the last commit.
	relayCtx, cancelRelay := context.WithCancel(context.WithoutCancel(ctx))
	m.cancelRelay = cancelRelay
	m.relayEnd = make(chan error, 1)
	go func() { m.relayEnd <- m.relays.Run(relayCtx) }()
	m.runDone = make(chan error, 1)
	go func() {
		err := m.runner.Run(runCtx)
		if err == nil && runCtx.Err() == nil {
			err = errors.New("the runner stopped by itself")
		}
		if err != nil {
			m.fail(fmt.Errorf("consumer: %w", err))
		}
		m.runDone <- err
	}()
	var hosts []string
	for _, h := range strings.Split(c.HTTPHosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			hosts = append(hosts, h)
		}
	}
	// The dashboard reads through every instance: each holds only its
	// partitions' conversations.
	browser := pipeline.Browser{R: m.runner, NC: m.nc}
	if err := m.serveHTTP(dashboard.Deps{Store: m.stores, Source: browser, JS: js, Profiles: profiles, Globals: c.Globals, Log: log, Hosts: hosts}); err != nil {
		return err
	}
	endpoint := "offline extractive condenser"
	if llmCfg.BaseURL != "" || llmCfg.Model != "" {
		endpoint = strings.TrimSpace(llmCfg.BaseURL + " " + llmCfg.Model)
	}
	clientURL := ""
	if m.ns != nil && c.Listen != "" {
		clientURL = m.ns.ClientURL()
	}
	log.Info("ctxpipe running", "nats", natsEndpoint(m.ns != nil, clientURL, m.nc.ConnectedUrlRedacted()), "db", filepath.Join(c.DataDir, store.SetFileName(0)), "store_files", m.stores.Len(), "http", c.HTTP,
		"profiles", len(profiles.IDs()), "condenser", endpoint, "memory_limit", m.MemoryLimit)
	return nil
}

// natsEndpoint is what the start line says of NATS: the server connected
// to, or, for the embedded server, the URL its clients connect to
// (clientURL), or that it opens no client port. The service's in-process
// connection reports the clients' default URL whatever --listen says, so
// it cannot tell.
func natsEndpoint(embedded bool, clientURL, connected string) string {
	switch {
	case !embedded:
		return connected
	case clientURL != "":
		return clientURL
	}
	return `embedded, in process only (--listen "": no client port)`
}

// lock takes the instance's name and holds it while runCtx lasts. If
// another process takes it over (this one was cut off longer than the
// lock's TTL), the runner is stopped and the service fails.
func (m *Main) lock(ctx context.Context, js jetstream.JetStream, runCtx context.Context) (*pipeline.InstanceLock, error) {
	host, _ := os.Hostname()
	dir, err := filepath.Abs(m.Config.DataDir)
	if err != nil {
		dir = m.Config.DataDir
	}
	// Another instance holding the lock is final; anything else (a
	// cluster still placing the lock bucket's peers, no quorum) is waited
	// out like the other start steps.
	var l *pipeline.InstanceLock
	retries := backoff.New(backoff.Policy{First: 250 * time.Millisecond, Max: 5 * time.Second})
	for start := time.Now(); ; {
		l, err = pipeline.AcquireLock(ctx, js, m.Config.Name, pipeline.Holder{Host: host, DataDir: dir, PID: os.Getpid(), CatchingUp: true}, m.Config.Replicas, m.Log)
		if err == nil {
			break
		}
		if errors.Is(err, pipeline.ErrLockHeld) || ctx.Err() != nil || time.Since(start) > time.Minute {
			return nil, err
		}
		wait := retries.Next()
		m.Log.Warn("cannot take the instance lock yet; retrying", "err", err, "retry_in", wait)
		if err := backoff.Sleep(ctx, wait); err != nil {
			return nil, err
		}
	}
	go func() {
		if err := l.Hold(runCtx); err != nil {
			m.fail(err)
			m.cancel()
		}
	}()
	return l, nil
}

// connect starts the embedded server, or connects to --nats-url.
func (m *Main) connect(ctx context.Context) error {
	c := m.Config
	if c.NATS.URL != "" {
		// A broker that is down at start is waited for, with backoff and a
		// log line per attempt, until ctx ends.
		cfg := c.NATS
		cfg.Log = m.Log
		if cfg.Name == "" {
			cfg.Name = "ctxpipe-consumer"
		}
		nc, err := bus.ConnectRetry(ctx, cfg)
		if err != nil {
			return err
		}
		m.nc = nc
		return nil
	}
	// The embedded server has nats.conf's accounts and users, and the
	// service logs in to it as ctxpipe (embedded.go).
	return m.startEmbedded()
}

func (m *Main) seedProfiles() ([]schema.Profile, error) {
	data, src := defaultProfiles, "built-in profiles"
	if f := m.Config.ProfilesFile; f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("profiles: %w", err)
		}
		data, src = b, f
	}
	var ps []schema.Profile
	if err := json.Unmarshal(data, &ps); err != nil {
		return nil, fmt.Errorf("%s: %w", src, err)
	}
	for i := range ps {
		if err := ps[i].Validate(); err != nil {
			return nil, fmt.Errorf("%s: %w", src, err)
		}
	}
	return ps, nil
}

// Failed delivers an error if the service stops working on its own (the
// runner gave up, or another instance took the consumer over): the process
// must then exit non-zero so that a supervisor restarts it, rather than
// stay up doing nothing.
func (m *Main) Failed() <-chan error { return m.failed }

func (m *Main) fail(err error) {
	m.Log.Error("service failed; exiting", "err", err)
	select {
	case m.failed <- err:
	default:
	}
}

// Close stops the service once; later calls return the first call's error.
func (m *Main) Close() error {
	m.closeOnce.Do(func() { m.closeErr = m.close() })
	return m.closeErr
}

// close stops the service in order: stop fetching and let the workers finish
// (or give back) what they hold, stop answering queries, flush the outbox,
// close SQLite, drain NATS, stop the embedded server.
func (m *Main) close() error {
	var errs []error
	if m.cancel != nil {
		m.cancel()
	}
	if m.runDone != nil {
		errs = append(errs, <-m.runDone)
	}
	if m.queries != nil {
		errs = append(errs, m.queries())
	}
	if m.relayEnd != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		errs = append(errs, m.relays.Flush(ctx))
		cancel()
		m.cancelRelay()
		errs = append(errs, <-m.relayEnd)
	}
	if m.http != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		errs = append(errs, m.http.Shutdown(ctx))
		cancel()
	}
	if m.stores != nil {
		errs = append(errs, m.stores.Close())
	}
	if m.nc != nil {
		errs = append(errs, m.nc.Drain())
	}
	if m.ns != nil {
		m.ns.Shutdown()
		m.ns.WaitForShutdown()
	}
	if m.unlockDir != nil {
		m.unlockDir()
	}
	var out []error
	for _, e := range errs {
		if e != nil && !errors.Is(e, context.Canceled) {
			out = append(out, e)
		}
	}
	if m.Log != nil {
		m.Log.Info("ctxpipe stopped")
	}
	return errors.Join(out...)
}
