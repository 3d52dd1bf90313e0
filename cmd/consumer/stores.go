package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/ctxpipe/ctxpipe/store"
)

// openStores opens the instance's state: files SQLite files in dir
// (store.Set; file 0 is the ctxpipe.db a single-file instance kept, which
// goes on serving its share of the partitions). Each file has its own
// writer, checkpointer and read pool; the pools are smaller when there are
// many files, so that the connections (each with its own page cache) stay
// about as many as with one file.
func openStores(ctx context.Context, dir string, files int, log *slog.Logger) (*store.Set, error) {
	if files < 1 {
		return nil, fmt.Errorf("--store-files %d: at least 1", files)
	}
	readers := max(2, 8/files)
	return store.OpenSet(ctx, dir, files, store.WithLogger(log.With("component", "store")), store.WithReaders(readers))
}

// relays are the outbox relays of the store's files, one per file, run
// and flushed together.
type relays []*store.Relay

// Run runs every relay until ctx is done; it returns their errors.
func (rs relays) Run(ctx context.Context) error {
	errs := make([]error, len(rs))
	var wg sync.WaitGroup
	for i, r := range rs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = r.Run(ctx)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Flush waits until every relay has published what was committed.
func (rs relays) Flush(ctx context.Context) error {
	var errs []error
	for _, r := range rs {
		errs = append(errs, r.Flush(ctx))
	}
	return errors.Join(errs...)
}

// Pending is the events committed and not yet published, in all files.
func (rs relays) Pending(ctx context.Context) (int, error) {
	sum := 0
	for _, r := range rs {
		n, err := r.Pending(ctx)
		if err != nil {
			return 0, err
		}
		sum += n
	}
	return sum, nil
}

// Skipped is the events given up on since start, in all files.
func (rs relays) Skipped() int64 {
	var sum int64
	for _, r := range rs {
		sum += r.Skipped()
	}
	return sum
}
