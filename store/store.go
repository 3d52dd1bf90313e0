package store

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// ErrClosed is returned by a Relay whose store was closed under it.
var ErrClosed = errors.New("store: closed")

// Store is an open ctxpipe database. Its methods are safe for concurrent use.
type Store struct {
	path   string
	w      *sql.DB // the single writer connection
	r      *sql.DB // read-only pool
	now    func() time.Time
	closed atomic.Bool
	cache  *messageCache
	// bulk is set while a bulk load (WithBulkLoad) has not ended.
	bulk atomic.Bool
	// flusher writes a bulk load's pages back to disk meanwhile.
	flusher *flusher
	// recent answers incremental history reads from memory (recent.go).
	recent *recent
	// ckpt copies the WAL back into the file beside the commits
	// (checkpoint.go); nil during a bulk load.
	ckpt *checkpointer
	busy string
	log  *slog.Logger
}

type config struct {
	busyTimeout time.Duration
	readers     int
	now         func() time.Time
	cacheBytes  int
	bulk        bool
	log         *slog.Logger
}

// Option changes how Open sets up a Store.
type Option func(*config)

// WithBusyTimeout sets how long a connection waits on a lock held by another
// process before SQLITE_BUSY (default 5s). Inside one process the writer is a
// single connection, so this mostly matters for outside tools reading the file.
func WithBusyTimeout(d time.Duration) Option { return func(c *config) { c.busyTimeout = d } }

// WithReaders sets the size of the read-only pool (default 4).
func WithReaders(n int) Option {
	return func(c *config) {
		if n > 0 {
			c.readers = n
		}
	}
}

// WithMessageCache bounds the cache of decoded message bodies (default
// DefaultMessageCacheBytes); 0 turns it off.
func WithMessageCache(bytes int) Option { return func(c *config) { c.cacheBytes = bytes } }

// WithBulkLoad opens a new database for a bulk load: a rebuild from the
// changelog, which writes a whole database at once. Until EndBulkLoad (or
// Close) the file is written without any durability: synchronous=OFF, and
// the rollback journal kept in memory instead of the WAL, so each page is
// written once, straight into the file, with no fsync. A crash or a failure
// leaves a file that may be corrupt, which is why Open refuses this option
// for a file that exists already: the caller made the file for this load
// and discards it when the load fails. EndBulkLoad fsyncs the file and puts
// back the WAL and synchronous=FULL. While the load runs, readers wait for
// the writer's transactions instead of reading beside them.
func WithBulkLoad() Option { return func(c *config) { c.bulk = true } }

// WithLogger sets where the store reports what it does in the background
// (default: nowhere).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.log = l } }

// WithClock sets the clock used for received_at, updated_at and published_at
// (default time.Now).
func WithClock(now func() time.Time) Option { return func(c *config) { c.now = now } }

// Open opens (creating if needed) the database at path, with its parent
// directories, and applies any migrations it has not seen yet.
func Open(ctx context.Context, path string, opts ...Option) (*Store, error) {
	cfg := config{busyTimeout: 5 * time.Second, readers: 4, now: time.Now, cacheBytes: DefaultMessageCacheBytes}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.log == nil {
		cfg.log = slog.New(slog.DiscardHandler)
	}
	if path == "" {
		return nil, errors.New("open store: empty path")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	if err := os.MkdirAll(filepath.Dir(abs), 0o755); err != nil {
		return nil, fmt.Errorf("open store: create directory: %w", err)
	}
	if cfg.bulk {
		if _, err := os.Lstat(abs); !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("open store %s for a bulk load: the file exists (a bulk load needs a new file)", abs)
		}
	}
	busy := strconv.FormatInt(cfg.busyTimeout.Milliseconds(), 10)
	// _txlock=immediate: every write transaction takes the write lock at
	// BEGIN, so it can never fail later on a read-to-write upgrade.
	// _stmt_cache_size: the committer's statements are prepared once, not
	// in every transaction (apply.go, sql.go).
	w, err := sql.Open("sqlite3", dsn(abs, "_journal_mode=WAL&_synchronous=FULL&_foreign_keys=on&_txlock=immediate&_stmt_cache_size=64&_busy_timeout="+busy))
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", abs, err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)
	s := &Store{path: abs, w: w, now: cfg.now, busy: busy, log: cfg.log}
	if cfg.cacheBytes > 0 {
		s.cache = newMessageCache(cfg.cacheBytes)
		// A quarter of the message cache's bytes: the bodies of the
		// latest appends of the conversations committed last.
		s.recent = newRecent(cfg.cacheBytes / 4)
	}
	if err := s.checkWriter(ctx); err != nil {
		w.Close()
		return nil, err
	}
	if err := s.migrate(ctx); err != nil {
		w.Close()
		return nil, err
	}
	if cfg.bulk {
		// Before the read pool opens: leaving WAL needs the only
		// connection.
		if err := s.beginBulk(ctx); err != nil {
			w.Close()
			return nil, err
		}
	}
	// The reader opens after the writer has created the file and switched it
	// to WAL: mode=ro cannot create either.
	// Each reader connection keeps the statements it prepared: the hot
	// queries (an agent's history read after every turn, its wait_for) are
	// a handful of fixed texts, and preparing one cost about as much as
	// running it.
	r, err := sql.Open("sqlite3", dsn(abs, "mode=ro&_foreign_keys=on&_stmt_cache_size=32&_busy_timeout="+busy))
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("open store %s: read pool: %w", abs, err)
	}
	r.SetMaxOpenConns(cfg.readers)
	r.SetMaxIdleConns(cfg.readers)
	if err := r.PingContext(ctx); err != nil {
		w.Close()
		r.Close()
		return nil, fmt.Errorf("open store %s: read pool: %w", abs, err)
	}
	s.r = r
	if !cfg.bulk {
		if err := s.startCheckpointer(ctx); err != nil {
			w.Close()
			r.Close()
			return nil, err
		}
	}
	return s, nil
}

// startCheckpointer moves the WAL's checkpoints off the commit path
// (checkpoint.go): the writer keeps its own only as a backstop.
func (s *Store) startCheckpointer(ctx context.Context) error {
	if _, err := s.w.ExecContext(ctx, fmt.Sprintf("PRAGMA wal_autocheckpoint=%d", backstopPages)); err != nil {
		return fmt.Errorf("open store %s: %w", s.path, err)
	}
	if _, err := s.w.ExecContext(ctx, fmt.Sprintf("PRAGMA journal_size_limit=%d", walSizeLimit)); err != nil {
		return fmt.Errorf("open store %s: %w", s.path, err)
	}
	c, err := startCheckpointer(ctx, s.path, s.busy, s.log)
	if err != nil {
		return fmt.Errorf("open store %s: checkpointer: %w", s.path, err)
	}
	s.ckpt = c
	return nil
}

// dsn builds a file: URI; the characters that URIs give a meaning to are
// escaped so any path works.
func dsn(path, params string) string {
	esc := strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23")
	return "file:" + esc.Replace(path) + "?" + params
}

// checkWriter verifies that the pragmas the durability promise rests on are
// really in force (a DSN typo would silently drop them).
func (s *Store) checkWriter(ctx context.Context) error {
	var mode string
	if err := s.w.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		return fmt.Errorf("open store %s: %w", s.path, err)
	}
	if !strings.EqualFold(mode, "wal") {
		return fmt.Errorf("open store %s: journal_mode is %q, want wal", s.path, mode)
	}
	var syncMode int
	if err := s.w.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&syncMode); err != nil {
		return fmt.Errorf("open store %s: %w", s.path, err)
	}
	if syncMode != 2 { // FULL
		return fmt.Errorf("open store %s: synchronous is %d, want 2 (FULL)", s.path, syncMode)
	}
	return nil
}

// beginBulk switches the writer to the bulk load's settings.
func (s *Store) beginBulk(ctx context.Context) error {
	var mode string
	if err := s.w.QueryRowContext(ctx, "PRAGMA journal_mode=MEMORY").Scan(&mode); err != nil {
		return fmt.Errorf("open store %s: bulk load: %w", s.path, err)
	}
	if !strings.EqualFold(mode, "memory") {
		return fmt.Errorf("open store %s: bulk load: journal_mode is %q, want memory", s.path, mode)
	}
	if _, err := s.w.ExecContext(ctx, "PRAGMA synchronous=OFF"); err != nil {
		return fmt.Errorf("open store %s: bulk load: %w", s.path, err)
	}
	f, err := startFlusher(s.path)
	if err != nil {
		return fmt.Errorf("open store %s: bulk load: %w", s.path, err)
	}
	s.flusher = f
	s.bulk.Store(true)
	return nil
}

// flushEvery is how often a bulk load's file is synced while it is
// written, so that EndBulkLoad finds little left to write: the disk works
// beside the load instead of after it.
const flushEvery = 20 * time.Millisecond

// flusher syncs a file now and then until stopped.
type flusher struct {
	stop chan struct{}
	done chan struct{}
	err  error // the first failed sync, read after done
}

func startFlusher(path string) (*flusher, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	fl := &flusher{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(fl.done)
		defer f.Close()
		t := time.NewTicker(flushEvery)
		defer t.Stop()
		for {
			select {
			case <-fl.stop:
				return
			case <-t.C:
				// A failed sync may leave the pages marked clean, so
				// that a later sync succeeds without writing them: it is
				// kept and reported by EndBulkLoad.
				if err := f.Sync(); err != nil && fl.err == nil {
					fl.err = err
				}
			}
		}
	}()
	return fl, nil
}

// end stops the flusher and returns its first failure.
func (fl *flusher) end() error {
	close(fl.stop)
	<-fl.done
	return fl.err
}

// EndBulkLoad ends a bulk load (WithBulkLoad): it puts the WAL and
// synchronous=FULL back, checks them as Open does, and fsyncs the file and
// its directory, so that everything loaded is durable when it returns. On a
// store not opened for a bulk load, or whose load has ended, it does
// nothing.
func (s *Store) EndBulkLoad(ctx context.Context) error {
	if !s.bulk.Load() {
		return nil
	}
	if s.closed.Load() {
		return ErrClosed
	}
	if err := s.flusher.end(); err != nil {
		return fmt.Errorf("end bulk load of %s: %w", s.path, err)
	}
	// synchronous first, so that leaving the memory journal is synced too.
	if _, err := s.w.ExecContext(ctx, "PRAGMA synchronous=FULL"); err != nil {
		return fmt.Errorf("end bulk load of %s: %w", s.path, err)
	}
	if _, err := s.w.ExecContext(ctx, "PRAGMA journal_mode=WAL"); err != nil {
		return fmt.Errorf("end bulk load of %s: %w", s.path, err)
	}
	if err := s.checkWriter(ctx); err != nil {
		return fmt.Errorf("end bulk load: %w", err)
	}
	for _, p := range []string{s.path, filepath.Dir(s.path)} {
		if err := syncPath(p); err != nil {
			return fmt.Errorf("end bulk load of %s: %w", s.path, err)
		}
	}
	if err := s.startCheckpointer(ctx); err != nil {
		return fmt.Errorf("end bulk load: %w", err)
	}
	s.bulk.Store(false)
	return nil
}

// syncPath fsyncs a file or a directory.
func syncPath(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Path is the absolute path of the database file.
func (s *Store) Path() string { return s.path }

// Close closes both pools. Committed data is durable before Commit returns;
// Close only releases the files, but for a bulk load not ended yet, which
// it ends first (EndBulkLoad).
func (s *Store) Close() error {
	if s.closed.Load() {
		return nil
	}
	var errs []error
	if s.bulk.Load() {
		errs = append(errs, s.EndBulkLoad(context.Background()))
	}
	if !s.closed.CompareAndSwap(false, true) {
		return nil
	}
	errs = append(errs, s.ckpt.close())
	if s.r != nil {
		errs = append(errs, s.r.Close())
	}
	errs = append(errs, s.w.Close())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close store %s: %w", s.path, err)
	}
	return nil
}

type migration struct {
	version int
	name    string
	sql     string
}

// migrations lists the embedded files NNNN_name.sql in version order.
func migrations() ([]migration, error) {
	names, err := fs.Glob(migrationFiles, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	var ms []migration
	for _, n := range names {
		base := filepath.Base(n)
		num, _, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %s: name must start with a positive version and '_'", base)
		}
		b, err := migrationFiles.ReadFile(n)
		if err != nil {
			return nil, err
		}
		ms = append(ms, migration{version: v, name: strings.TrimSuffix(base, ".sql"), sql: string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	for i := 1; i < len(ms); i++ {
		if ms[i].version == ms[i-1].version {
			return nil, fmt.Errorf("migrations %s and %s share version %d", ms[i-1].name, ms[i].name, ms[i].version)
		}
	}
	return ms, nil
}

// migrationHooks holds the Go part of a migration, run in its transaction
// right after its SQL: what SQL alone cannot do (SQLite has no sha256).
var migrationHooks = map[int]func(context.Context, *sql.Tx) error{
	3: backfillInputs,
}

// migrate applies, each in its own transaction, the migrations whose version
// is not in schema_version yet. Running it again is a no-op.
func (s *Store) migrate(ctx context.Context) error {
	ms, err := migrations()
	if err != nil {
		return fmt.Errorf("migrate %s: %w", s.path, err)
	}
	if _, err := s.w.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_version (
		version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)`); err != nil {
		return fmt.Errorf("migrate %s: create schema_version: %w", s.path, err)
	}
	var have int
	if err := s.w.QueryRowContext(ctx, "SELECT COALESCE(MAX(version), 0) FROM schema_version").Scan(&have); err != nil {
		return fmt.Errorf("migrate %s: %w", s.path, err)
	}
	if len(ms) > 0 && have > ms[len(ms)-1].version {
		return fmt.Errorf("migrate %s: database is at version %d, newer than this binary (%d)", s.path, have, ms[len(ms)-1].version)
	}
	for _, m := range ms {
		if m.version <= have {
			continue
		}
		tx, err := s.w.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("migrate %s: %s: %w", s.path, m.name, err)
		}
		if _, err := tx.ExecContext(ctx, m.sql); err != nil {
			tx.Rollback()
			return fmt.Errorf("migrate %s: %s: %w", s.path, m.name, err)
		}
		if hook := migrationHooks[m.version]; hook != nil {
			if err := hook(ctx, tx); err != nil {
				tx.Rollback()
				return fmt.Errorf("migrate %s: %s: %w", s.path, m.name, err)
			}
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO schema_version (version, name, applied_at) VALUES (?, ?, ?)",
			m.version, m.name, s.now().UnixMilli()); err != nil {
			tx.Rollback()
			return fmt.Errorf("migrate %s: %s: %w", s.path, m.name, err)
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("migrate %s: %s: %w", s.path, m.name, err)
		}
	}
	return nil
}

// SchemaVersion is the highest migration applied to the database.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	var v int
	if err := s.r.QueryRowContext(ctx, "SELECT COALESCE(MAX(version), 0) FROM schema_version").Scan(&v); err != nil {
		return 0, fmt.Errorf("schema version: %w", err)
	}
	return v, nil
}
