package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/changelog"
	"github.com/ctxpipe/ctxpipe/store"
)

// errNotIdentical fails a rebuild whose result differs from the database it
// was to replace.
var errNotIdentical = errors.New("the rebuilt database differs from the current one; both are kept")

// errSplitRebuild refuses to rebuild a state split over several files.
var errSplitRebuild = errors.New("--rebuild handles a data dir of one SQLite file (--store-files 1); with several, stop the instance and move its ctxpipe*.db files away: it restores its partitions from CTX_STATE at start")

// RebuildDB rebuilds the instance's SQLite file from CTX_STATE alone (the
// instance must be stopped). With a current file, it rebuilds exactly the
// changelog positions that file reached, compares the two table by table,
// row by row and byte by byte (store.Diff), and replaces the file only when
// they are identical (the old one is kept beside it as .replaced). Without
// one, the rebuilt file simply takes its place. Progress and the result go
// to out.
func (m *Main) RebuildDB(ctx context.Context, out io.Writer) error {
	if m.Log == nil {
		m.Log = m.logger()
	}
	if err := os.MkdirAll(m.Config.DataDir, 0o755); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	// "The instance must be stopped": the data dir's lock says whether it is.
	unlock, err := lockDataDir(m.Config.DataDir)
	if err != nil {
		return err
	}
	m.unlockDir = unlock
	if err := m.connect(ctx); err != nil {
		m.Close()
		return err
	}
	defer m.Close()
	js, err := jetstream.New(m.nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	// One file only, so far: a state split over files (--store-files) is
	// rebuilt by removing its files, which the instance then restores from
	// CTX_STATE as it restores any partition it gains (operations.md 4.3).
	if _, err := os.Stat(filepath.Join(m.Config.DataDir, store.SetFileName(1))); m.Config.StoreFiles > 1 || err == nil {
		return errSplitRebuild
	}
	current := filepath.Join(m.Config.DataDir, store.SetFileName(0))
	rebuilt := current + ".rebuild"
	var opts changelog.RebuildOptions
	_, statErr := os.Stat(current)
	exists := statErr == nil
	if exists {
		old, err := store.Open(ctx, current)
		if err != nil {
			return err
		}
		opts.UpTo, _, err = old.LogPositions(ctx)
		old.Close()
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "rebuilding %s from CTX_STATE up to the positions of its %d partitions\n", current, len(opts.UpTo))
	} else {
		fmt.Fprintf(out, "no %s: rebuilding it from all of CTX_STATE\n", current)
	}
	for _, f := range []string{rebuilt, rebuilt + "-wal", rebuilt + "-shm"} {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	// A fresh file, deleted above: a bulk load (no journal, no fsync per
	// transaction) is honest here, and Close makes it durable.
	st, err := store.Open(ctx, rebuilt, store.WithBulkLoad())
	if err != nil {
		return err
	}
	last := time.Now()
	opts.Progress = func(done, total uint64) {
		if time.Since(last) >= time.Second {
			last = time.Now()
			fmt.Fprintf(out, "  %d / %d changelog messages\n", done, total)
		}
	}
	stats, err := changelog.Rebuild(ctx, js, st, opts)
	if cerr := st.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "replayed %d messages, %d records, %d changes in %v (%.0f changes/s)\n",
		stats.Messages, stats.Records, stats.Entries, stats.Took.Round(time.Millisecond), stats.PerSecond())
	if stats.Skipped > 0 {
		fmt.Fprintf(out, "skipped %d messages or records, as the running instances skip them (unreadable, or refused by the store)\n", stats.Skipped)
	}
	if !exists {
		if err := os.Rename(rebuilt, current); err != nil {
			return err
		}
		fmt.Fprintf(out, "%s rebuilt\n", current)
		return nil
	}
	report, err := store.Diff(ctx, current, rebuilt)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, strings.TrimRight(report.String(), "\n"))
	if !report.Identical() {
		return fmt.Errorf("%w (%s, %s)", errNotIdentical, current, rebuilt)
	}
	replaced := current + ".replaced"
	for _, sfx := range []string{"", "-wal", "-shm"} {
		if err := os.Rename(current+sfx, replaced+sfx); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	// Diff's read-only look may have left an empty -wal and -shm beside
	// the rebuilt file: they move with it.
	for _, sfx := range []string{"", "-wal", "-shm"} {
		if err := os.Rename(rebuilt+sfx, current+sfx); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	fmt.Fprintf(out, "identical: %s replaced (the old file is %s)\n", current, replaced)
	return nil
}
