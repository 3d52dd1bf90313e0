package main

import (
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/pipeline"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/store"
)

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
