package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/changelog"
	"github.com/ctxpipe/ctxpipe/store"
)

// errNotIdentical fails a rebuild whose result differs from the database it
// was to replace.
var errNotIdentical = errors.New("the rebuilt database differs from the current one; both are kept")

// errBeyondSet refuses a data dir holding a state file that --store-files
// does not count: the flag is probably not the instance's.
var errBeyondSet = errors.New("the data dir holds a state file beyond --store-files: pass the instance's --store-files (or move the file away if the instance no longer uses it)")

// rebuildFile is one SQLite file of the instance's state being rebuilt.
type rebuildFile struct {
	name    string // ctxpipe.db, ctxpipe-1.db, …
	current string // its path
	rebuilt string // where it is rebuilt: current + ".rebuild"
	exists  bool
	opts    changelog.RebuildOptions
	report  store.DiffReport
	diffErr error
}

// RebuildDB rebuilds the instance's SQLite files (--store-files of them)
// from CTX_STATE alone (the instance must be stopped), all at once, each
// from its partitions' subjects with its own writer. A file that exists is
// rebuilt exactly up to the changelog positions it reached and compared
// with the rebuilt one table by table, row by row and byte by byte
// (store.Diff); a file that does not exist is rebuilt from all of its
// partitions' changelog. Only when every file was rebuilt and every
// existing one is identical are they replaced (the old ones kept beside
// them as .replaced) and the missing ones put in place; otherwise nothing
// is replaced, the rebuilt files are kept beside the current ones, and the
// error names the files that differ or failed. Progress and the result,
// per file and in total, go to out.
func (m *Main) RebuildDB(ctx context.Context, out io.Writer) error {
	if m.Log == nil {
		m.Log = m.logger()
	}
	n := m.Config.StoreFiles
	if n < 1 {
		return fmt.Errorf("--store-files %d: at least 1", n)
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
	if err := checkSetFiles(m.Config.DataDir, n); err != nil {
		return err
	}
	if err := m.connect(ctx); err != nil {
		m.Close()
		return err
	}
	defer m.Close()
	js, err := jetstream.New(m.nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	files, err := planRebuild(ctx, js, m.Config.DataDir, n, out)
	if err != nil {
		return err
	}
	if err := rebuildFiles(ctx, js, files, out); err != nil {
		return err
	}
	diffFiles(ctx, files)
	var errs []error
	for _, f := range files {
		if !f.exists {
			continue
		}
		if n == 1 {
			fmt.Fprintln(out, strings.TrimRight(f.report.String(), "\n"))
		} else {
			for line := range strings.Lines(strings.TrimRight(f.report.String(), "\n")) {
				fmt.Fprintf(out, "%s: %s", f.name, line)
			}
			fmt.Fprintln(out)
		}
		switch {
		case f.diffErr != nil:
			errs = append(errs, fmt.Errorf("%s: compare: %w", f.name, f.diffErr))
		case !f.report.Identical():
			errs = append(errs, fmt.Errorf("%s: %w (%s, %s)", f.name, errNotIdentical, f.current, f.rebuilt))
		}
	}
	if err := errors.Join(errs...); err != nil {
		if n > 1 {
			fmt.Fprintf(out, "not replaced: no file of the %d is replaced while one differs\n", n)
		}
		return err
	}
	for i := range files {
		if err := files[i].install(); err != nil {
			return fmt.Errorf("%s: %w", files[i].name, err)
		}
	}
	for _, f := range files {
		if f.exists {
			fmt.Fprintf(out, "identical: %s replaced (the old file is %s)\n", f.current, f.current+".replaced")
		} else {
			fmt.Fprintf(out, "%s rebuilt\n", f.current)
		}
	}
	return nil
}

// setFileName matches the names of the files of a store.Set.
var setFileName = regexp.MustCompile(`^ctxpipe(?:-([0-9]+))?\.db$`)

// checkSetFiles refuses a data dir holding a state file with an index of n
// or more: the instance that left it split its state over more files than
// n, and rebuilding only n of them would prove nothing of the others.
func checkSetFiles(dir string, n int) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	for _, e := range entries {
		m := setFileName.FindStringSubmatch(e.Name())
		if m == nil || m[1] == "" {
			continue
		}
		if i, err := strconv.Atoi(m[1]); err == nil && i >= n {
			return fmt.Errorf("%w: %s with --store-files %d", errBeyondSet, filepath.Join(dir, e.Name()), n)
		}
	}
	return nil
}

// planRebuild decides what each of the n files is rebuilt from: an existing
// file up to its positions (its partitions being those it holds positions
// of), a missing one from all of its partitions' changelog. It clears what
// an earlier rebuild left at the rebuilt files' paths.
func planRebuild(ctx context.Context, js jetstream.JetStream, dir string, n int, out io.Writer) ([]rebuildFile, error) {
	files := make([]rebuildFile, n)
	var missing bool
	for i := range files {
		f := &files[i]
		f.name = store.SetFileName(i)
		f.current = filepath.Join(dir, f.name)
		f.rebuilt = f.current + ".rebuild"
		_, err := os.Stat(f.current)
		f.exists = err == nil
		missing = missing || !f.exists
		for _, p := range []string{f.rebuilt, f.rebuilt + "-wal", f.rebuilt + "-shm"} {
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				return nil, err
			}
		}
	}
	// With several files each reads its partitions' subjects alone; with
	// one, the whole changelog, as a single-file instance follows it.
	var all []int
	if missing && n > 1 {
		var err error
		if all, err = changelog.StatePartitions(ctx, js); err != nil {
			return nil, err
		}
	}
	for i := range files {
		f := &files[i]
		if !f.exists {
			if n > 1 {
				f.opts.Partitions = []int{} // not nil: a file with no partition reads none
				for _, p := range all {
					if p%n == i {
						f.opts.Partitions = append(f.opts.Partitions, p)
					}
				}
			}
			fmt.Fprintf(out, "no %s: rebuilding it from all of CTX_STATE\n", f.current)
			continue
		}
		old, err := store.Open(ctx, f.current)
		if err != nil {
			return nil, err
		}
		f.opts.UpTo, _, err = old.LogPositions(ctx)
		old.Close()
		if err != nil {
			return nil, err
		}
		if n > 1 {
			// Positions of partitions now mapped to another file (the
			// number of files changed) count too: the file holds them.
			f.opts.Partitions = slices.Sorted(func(yield func(int) bool) {
				for p := range f.opts.UpTo {
					if !yield(p) {
						return
					}
				}
			})
		}
		fmt.Fprintf(out, "rebuilding %s from CTX_STATE up to the positions of its %d partitions\n", f.current, len(f.opts.UpTo))
	}
	return files, nil
}

// rebuildFiles rebuilds every file at once into its .rebuild path and
// reports each file's replay and the total.
func rebuildFiles(ctx context.Context, js jetstream.JetStream, files []rebuildFile, out io.Writer) error {
	var mu sync.Mutex // out is written by every file's progress
	jobs := make([]changelog.RebuildFile, len(files))
	for i := range files {
		f := &files[i]
		// A fresh file, deleted above: a bulk load (no journal, no fsync
		// per transaction) is honest here, and Close makes it durable.
		st, err := store.Open(ctx, f.rebuilt, store.WithBulkLoad())
		if err != nil {
			for _, j := range jobs[:i] {
				j.Store.Close()
			}
			return err
		}
		prefix := ""
		if len(files) > 1 {
			prefix = f.name + ": "
		}
		last := time.Now()
		f.opts.Progress = func(done, total uint64) {
			if time.Since(last) >= time.Second {
				last = time.Now()
				mu.Lock()
				fmt.Fprintf(out, "  %s%d / %d changelog messages\n", prefix, done, total)
				mu.Unlock()
			}
		}
		jobs[i] = changelog.RebuildFile{Name: f.name, Store: st, Options: f.opts}
	}
	t0 := time.Now()
	stats, err := changelog.RebuildFiles(ctx, js, jobs)
	for i := range jobs {
		// Close ends the bulk load: the rebuilt file is durable after it.
		if cerr := jobs[i].Store.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("%s: %w", files[i].name, cerr))
		}
	}
	took := time.Since(t0)
	if err != nil {
		return err
	}
	for i, st := range stats {
		prefix := ""
		if len(files) > 1 {
			prefix = files[i].name + ": "
		}
		fmt.Fprintf(out, "%sreplayed %d messages, %d records, %d changes in %v (%.0f changes/s)\n",
			prefix, st.Messages, st.Records, st.Entries, st.Took.Round(time.Millisecond), st.PerSecond())
		if st.Skipped > 0 {
			fmt.Fprintf(out, "%sskipped %d messages or records, as the running instances skip them (unreadable, or refused by the store)\n", prefix, st.Skipped)
		}
	}
	if len(files) > 1 {
		total := changelog.SumStats(stats)
		total.Took = took
		fmt.Fprintf(out, "total: %d files, %d messages, %d records, %d changes in %v (%.0f changes/s)\n",
			len(files), total.Messages, total.Records, total.Entries, total.Took.Round(time.Millisecond), total.PerSecond())
	}
	return nil
}

// diffFiles compares every existing file with its rebuilt one, all at once.
func diffFiles(ctx context.Context, files []rebuildFile) {
	var wg sync.WaitGroup
	for i := range files {
		f := &files[i]
		if !f.exists {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.report, f.diffErr = store.Diff(ctx, f.current, f.rebuilt)
		}()
	}
	wg.Wait()
}

// install puts the rebuilt file in the current one's place, keeping the
// current one (and its -wal and -shm) as .replaced.
func (f *rebuildFile) install() error {
	if f.exists {
		replaced := f.current + ".replaced"
		for _, sfx := range []string{"", "-wal", "-shm"} {
			if err := os.Rename(f.current+sfx, replaced+sfx); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	}
	// Diff's read-only look may have left an empty -wal and -shm beside
	// the rebuilt file: they move with it.
	for _, sfx := range []string{"", "-wal", "-shm"} {
		if err := os.Rename(f.rebuilt+sfx, f.current+sfx); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}
