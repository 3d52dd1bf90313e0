package changelog

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/store"
)

// A RebuildFile is one SQLite file of a rebuild and what of CTX_STATE goes
// into it: Options.Partitions names the partitions it reads (their subjects
// alone), and Options.UpTo, when set, where each stops.
type RebuildFile struct {
	// Name names the file in errors ("ctxpipe-1.db").
	Name    string
	Store   *store.Store
	Options RebuildOptions
}

// RebuildFiles rebuilds files all at once, each by Rebuild with its own
// options: each follows its partitions' subjects alone and has its own
// writer, so the files' SQLite work runs in parallel. It returns each
// file's stats (Took is each file's own) and the files' failures, each
// wrapped with its file's name; the first failure stops the others, which
// are then not reported as failures of their own.
func RebuildFiles(ctx context.Context, js jetstream.JetStream, files []RebuildFile) ([]RebuildStats, error) {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		stats = make([]RebuildStats, len(files))
		errs  = make([]error, len(files))
	)
	for i, f := range files {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if stats[i], errs[i] = Rebuild(rctx, js, f.Store, f.Options); errs[i] != nil {
				cancel()
			}
		}()
	}
	wg.Wait()
	failed := slices.ContainsFunc(errs, func(err error) bool { return err != nil && !errors.Is(err, context.Canceled) })
	for i, err := range errs {
		switch {
		case err == nil:
		case failed && ctx.Err() == nil && errors.Is(err, context.Canceled):
			errs[i] = nil // stopped by another file's failure
		default:
			errs[i] = fmt.Errorf("%s: %w", files[i].Name, err)
		}
	}
	return stats, errors.Join(errs...)
}

// StatePartitions are the partitions that have messages in CTX_STATE, in
// increasing order.
func StatePartitions(ctx context.Context, js jetstream.JetStream) ([]int, error) {
	s, err := js.Stream(ctx, bus.StreamState)
	if err != nil {
		return nil, fmt.Errorf("partitions of %s: %w", bus.StreamState, err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(bus.StateSubjects))
	if err != nil {
		return nil, fmt.Errorf("partitions of %s: %w", bus.StreamState, err)
	}
	var parts []int
	for subject := range info.State.Subjects {
		if p, ok := bus.PartitionOfState(subject); ok {
			parts = append(parts, p)
		}
	}
	slices.Sort(parts)
	return parts, nil
}

// RebuildSet rebuilds every file of set, which should be new, from the
// partitions it holds (store.Set.FileOf), all files at once (RebuildFiles).
// The stats are the files' summed, Took the whole rebuild's; opts.Progress
// is not called.
func RebuildSet(ctx context.Context, js jetstream.JetStream, set *store.Set, opts RebuildOptions) (RebuildStats, error) {
	t0 := time.Now()
	all, err := StatePartitions(ctx, js)
	if err != nil {
		return RebuildStats{}, fmt.Errorf("rebuild: %w", err)
	}
	opts.Progress = nil
	files := make([]RebuildFile, set.Len())
	for i := range files {
		files[i] = RebuildFile{Name: fmt.Sprintf("file %d", i), Store: set.File(i), Options: opts}
		files[i].Options.Partitions = []int{} // not nil: a file with no partition reads none
	}
	for _, p := range all {
		f := &files[set.FileOf(p)].Options
		f.Partitions = append(f.Partitions, p)
	}
	if len(files) == 1 {
		// Its partitions are all of them: the whole stream is read.
		files[0].Options.Partitions = nil
	}
	stats, err := RebuildFiles(ctx, js, files)
	total := SumStats(stats)
	total.Took = time.Since(t0)
	return total, err
}

// SumStats adds up the stats of several files; Took is the longest.
func SumStats(stats []RebuildStats) RebuildStats {
	var total RebuildStats
	for _, st := range stats {
		total.Messages += st.Messages
		total.Records += st.Records
		total.Entries += st.Entries
		total.Skipped += st.Skipped
		total.Took = max(total.Took, st.Took)
	}
	return total
}
