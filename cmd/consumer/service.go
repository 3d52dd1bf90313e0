package main

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
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

// Config is the service's configuration; flags override DefaultConfig.
type Config struct {
	DataDir      string // SQLite file and the embedded server's JetStream store
	Listen       string // embedded server address; "" disables the TCP listener
	HTTP         string // /metrics and /healthz; "" disables
	HTTPHosts    string // names besides addresses and localhost the dashboard answers to, comma-separated
	ProfilesFile string // seeds the profiles bucket; the built-in set when ""
	LogLevel     string
	LogFormat    string // text or json
	// Retention is how long published outbox rows and rejected inputs'
	// payload prefixes are kept; PruneEvery is how often they are pruned.
	// Messages, events and applied inputs are never pruned.
	Retention  time.Duration
	PruneEvery time.Duration
	// Replicas of the streams and buckets ctxpipe creates (1 for one
	// server, 3 for a cluster). Starting never lowers an existing stream's.
	Replicas int
	// Partitions is N when ctxpipe creates CTX_IN (an existing stream keeps
	// its own). Name is this instance's, unique among those running.
	Partitions int
	Name       string
	// StoreFiles is how many SQLite files the state is split over, by
	// partition (store.Set): each has its own committer.
	StoreFiles int
	// Rebuild, when set, rebuilds the SQLite file from CTX_STATE, proves it
	// identical to the current one and exits instead of serving.
	Rebuild bool
	// MemoryLimit is the Go runtime's soft memory limit in bytes (0: as
	// memoryLimit derives it; negative: none). main applies it.
	MemoryLimit int64
	NATS        bus.ConnConfig
	Globals     schema.Globals
	Pipeline    pipeline.Config
}

// DefaultConfig runs everything embedded under ./data.
func DefaultConfig() Config {
	return Config{
		DataDir:    "data",
		Listen:     "127.0.0.1:4222",
		HTTP:       "127.0.0.1:9464",
		LogLevel:   "info",
		LogFormat:  "text",
		Retention:  7 * 24 * time.Hour,
		Partitions: bus.DefaultPartitions,
		StoreFiles: store.DefaultSetFiles,
		PruneEvery: time.Hour,
		Globals:    schema.DefaultGlobals(),
		Pipeline:   pipeline.DefaultConfig(),
	}
}

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

// ParseFlags reads the command line into m.Config.
func (m *Main) ParseFlags(args []string) error {
	c := &m.Config
	fs := flag.NewFlagSet("consumer", flag.ContinueOnError)
	fs.StringVar(&c.DataDir, "data-dir", c.DataDir, "directory for the SQLite file and the embedded server's JetStream store")
	fs.StringVar(&c.Listen, "listen", c.Listen, "address of the embedded NATS server (ignored with --nats-url)")
	fs.StringVar(&c.HTTP, "http", c.HTTP, `address for the dashboard, /metrics, /healthz and /readyz ("" disables)`)
	fs.StringVar(&c.HTTPHosts, "http-hosts", c.HTTPHosts, "host names the dashboard answers to besides IP addresses and localhost, comma-separated (behind a proxy that authenticates)")
	fs.StringVar(&c.ProfilesFile, "profiles", c.ProfilesFile, "JSON array of profiles that seeds the ctx_profiles bucket (built-in set when empty)")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "text or json")
	fs.IntVar(&c.Replicas, "replicas", c.Replicas, "replicas of CTX_IN, CTX_EVENTS and the buckets (3 on a cluster; 0: 1 when creating them, an existing stream's as they are); an existing stream's are raised when asked, never lowered")
	fs.IntVar(&c.Partitions, "partitions", c.Partitions, "partitions of CTX_IN when ctxpipe creates it (fixed for a deployment: an existing stream keeps its own)")
	fs.IntVar(&c.StoreFiles, "store-files", c.StoreFiles, "SQLite files the state is split over by partition, each committed by its own writer (more: more commits at once)")
	fs.StringVar(&c.Name, "name", c.Name, "this instance's name, unique among the running instances (default: host name and a hash of the data dir)")
	fs.BoolVar(&c.Rebuild, "rebuild", c.Rebuild, "rebuild the SQLite file from CTX_STATE alone, prove it identical to the current one, and exit")
	fs.DurationVar(&c.Retention, "retention", c.Retention, "how long published outbox rows and rejected payloads are kept (history, events and applied inputs are kept for ever)")
	fs.DurationVar(&c.PruneEvery, "prune-every", c.PruneEvery, "how often old outbox rows and rejected payloads are pruned")
	fs.BoolVar(&c.Globals.AutoCondense, "auto-condense", c.Globals.AutoCondense, "condense automatically when a profile does not say (Roo's autoCondenseContext)")
	fs.IntVar(&c.Globals.AutoCondensePercent, "condense-percent", c.Globals.AutoCondensePercent, "global condense threshold, percent of the window (Roo's autoCondenseContextPercent, 5-100)")
	fs.IntVar(&c.Pipeline.Lanes, "lanes", c.Pipeline.Lanes, "conversations applied at once")
	fs.DurationVar(&c.Pipeline.AckWait, "ack-wait", c.Pipeline.AckWait, "JetStream ack wait (in-progress acks every third of it)")
	fs.IntVar(&c.Pipeline.MaxHeldBytes, "max-held-bytes", c.Pipeline.MaxHeldBytes, "payload bytes fetched and not yet acked, at most; past it fetching waits (the main term of the memory bound)")
	memLimit := fs.String("memory-limit", "", "soft limit of the process's Go heap, as GOMEMLIMIT is written (512MiB, 2GiB) or off (default: --max-held-bytes + 256 MiB, or GOMEMLIMIT when set)")
	fs.IntVar(&c.Pipeline.Standby, "standby", c.Pipeline.Standby, "instances besides its owner that keep each partition's state, ready to take it over (0: the new owner restores it from the changelog)")
	fs.IntVar(&c.Pipeline.MaxDeliver, "max-deliver", c.Pipeline.MaxDeliver, "deliveries before an input is rejected as poison")
	fs.DurationVar(&c.Pipeline.ShutdownTimeout, "shutdown-timeout", c.Pipeline.ShutdownTimeout, "how long a graceful stop may take")
	c.NATS.RegisterFlags(fs)
	// The shared flag's default is the clients' (nats://127.0.0.1:4222);
	// the service's is its embedded server, and --help must say so.
	if f := fs.Lookup("nats-url"); f != nil {
		f.DefValue = ""
		f.Usage = "NATS server URL(s), comma-separated (env NATS_URL); default: the embedded server (see --listen)"
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	var err error
	if c.MemoryLimit, err = parseMemoryLimit(*memLimit); err != nil {
		return err
	}
	// The shared flag defaults to the standard local URL for clients; the
	// service runs its embedded server unless a URL is asked for.
	explicit := os.Getenv("NATS_URL") != ""
	fs.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "nats-url" })
	if !explicit {
		c.NATS.URL = ""
	}
	if c.Partitions < 1 || c.Partitions > bus.MaxPartitions {
		return fmt.Errorf("--partitions %d must be in [1, %d]", c.Partitions, bus.MaxPartitions)
	}
	if c.Name != "" && !validName(c.Name) {
		return fmt.Errorf("--name %q: use letters, digits, '-' and '_' only", c.Name)
	}
	if c.Replicas < 0 || c.Replicas > 5 {
		return fmt.Errorf("--replicas %d must be in [0, 5]", c.Replicas)
	}
	if c.Retention <= 0 || c.PruneEvery <= 0 {
		return fmt.Errorf("--retention and --prune-every must be positive")
	}
	if p := c.Globals.AutoCondensePercent; p < schema.MinCondenseThreshold || p > schema.MaxCondenseThreshold {
		return fmt.Errorf("--condense-percent %d must be in [%d, %d]", p, schema.MinCondenseThreshold, schema.MaxCondenseThreshold)
	}
	return c.Pipeline.Validate()
}

func (m *Main) logger() *slog.Logger {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(m.Config.LogLevel)); err != nil {
		lvl = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: lvl}
	if m.Config.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}

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
	profiles, err := pipeline.WatchProfiles(runCtx, kv, log, m.nc.StatusChanged(nats.CONNECTED))
	if err != nil {
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
	// 250 ms, which made an idle instance read the outbox four times a
	// second (a fifth of its idle CPU), per file.
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

// natsLogger sends the embedded server's notices and errors to slog.
type natsLogger struct{ l *slog.Logger }

func (n natsLogger) Noticef(format string, v ...any) { n.l.Debug("nats: " + fmt.Sprintf(format, v...)) }
func (n natsLogger) Warnf(format string, v ...any)   { n.l.Warn("nats: " + fmt.Sprintf(format, v...)) }
func (n natsLogger) Fatalf(format string, v ...any)  { n.l.Error("nats: " + fmt.Sprintf(format, v...)) }
func (n natsLogger) Errorf(format string, v ...any)  { n.l.Error("nats: " + fmt.Sprintf(format, v...)) }
func (n natsLogger) Debugf(format string, v ...any)  { n.l.Debug("nats: " + fmt.Sprintf(format, v...)) }
func (n natsLogger) Tracef(format string, v ...any)  {}

// validName tells whether s can name an instance (a KV key token).
func validName(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// defaultName names an instance after its host and data directory, so that
// several instances on one machine (each with its own --data-dir) get
// distinct names, and one restarting keeps its own.
func defaultName(dataDir string) string {
	host, _ := os.Hostname()
	clean := make([]rune, 0, len(host))
	for _, r := range host {
		if !validName(string(r)) {
			r = '-'
		}
		clean = append(clean, r)
	}
	if len(clean) > 40 {
		clean = clean[:40]
	}
	if len(clean) == 0 {
		clean = []rune("ctxpipe")
	}
	dir, err := filepath.Abs(dataDir)
	if err != nil {
		dir = dataDir
	}
	sum := sha256.Sum256([]byte(dir))
	return string(clean) + "-" + hex.EncodeToString(sum[:4])
}
