package changelog

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/store"
)

// RebuildStats is what a rebuild did.
type RebuildStats struct {
	Messages uint64 // CTX_STATE messages read
	Records  int    // records applied
	Entries  int    // inputs (changes) applied
	// Skipped are the messages and records skipped as a running instance's
	// follower skips them (unreadable, or refused by the store), so that
	// the rebuilt file is what such an instance holds.
	Skipped int
	Took    time.Duration
}

// PerSecond is the replay rate in changes (entries) per second.
func (s RebuildStats) PerSecond() float64 {
	if s.Took <= 0 {
		return 0
	}
	return float64(s.Entries) / s.Took.Seconds()
}

// RebuildOptions tunes Rebuild.
type RebuildOptions struct {
	// UpTo, when set, stops each partition at the sequence given (a
	// partition it does not name is skipped): to rebuild exactly what
	// another database holds (its store.LogPositions).
	UpTo map[int]uint64
	// BatchEntries bounds the entries per transaction (default 4096).
	BatchEntries int
	// Progress, when set, is called after each transaction.
	Progress func(done, total uint64)
	// Partitions, when not nil, are the only partitions read (their
	// subjects alone are followed): to rebuild one file of a store.Set.
	Partitions []int
}

// Rebuild applies CTX_STATE, from its first message to the last one when it
// starts, to st, which should be empty. Events are stored as published:
// a rebuild never announces anything again.
func Rebuild(ctx context.Context, js jetstream.JetStream, st *store.Store, opts RebuildOptions) (RebuildStats, error) {
	t0 := time.Now()
	var stats RebuildStats
	if opts.BatchEntries <= 0 {
		opts.BatchEntries = 4096
	}
	s, err := js.Stream(ctx, bus.StreamState)
	if err != nil {
		return stats, fmt.Errorf("rebuild: %w", err)
	}
	last := s.CachedInfo().State.LastSeq
	var subjects []string
	if opts.Partitions != nil {
		// The last message of the partitions read is where it ends.
		for _, p := range opts.Partitions {
			subjects = append(subjects, bus.StateSubject(p))
		}
		if last, err = lastOfAll(ctx, s, opts.Partitions); err != nil {
			return stats, fmt.Errorf("rebuild: %w", err)
		}
	}
	if opts.UpTo != nil {
		// Nothing past the last position named is applied: the read
		// stops there.
		var upTo uint64
		for _, seq := range opts.UpTo {
			upTo = max(upTo, seq)
		}
		last = min(last, upTo)
	}
	if last == 0 {
		stats.Took = time.Since(t0)
		return stats, st.EndBulkLoad(ctx)
	}
	fctx, stop := context.WithCancel(ctx)
	defer stop()
	items := make(chan Item, 4096)
	followErr := make(chan error, 1)
	if subjects != nil {
		go func() { followErr <- FollowLive(fctx, js, subjects, 1, false, nil, items) }()
	} else {
		go func() { followErr <- Follow(fctx, js, 1, nil, items) }()
	}

	var (
		groups    []store.Group
		positions = map[int]uint64{}
		n         int
		cursor    uint64
	)
	flush := func() error {
		if len(groups) == 0 {
			return st.SetLogCursor(ctx, cursor)
		}
		// go-sqlite3 runs each statement under a context that can be
		// cancelled on a goroutine of its own, to interrupt it: a
		// transaction of thousands of inserts paid that for each one (a
		// third of the rebuild's time). The records are applied under a
		// context that cannot be, and the loop stops between them.
		tx, err := st.Begin(context.WithoutCancel(ctx), groups)
		for ge := (*store.GroupError)(nil); errors.As(err, &ge); {
			stats.Skipped++
			n -= len(groups[ge.Group].Entries)
			groups = slices.Delete(groups, ge.Group, ge.Group+1)
			tx, err = st.Begin(context.WithoutCancel(ctx), groups)
		}
		if err != nil {
			return fmt.Errorf("rebuild: apply up to %d: %w", cursor, err)
		}
		if err := tx.Commit(positions, cursor); err != nil {
			return fmt.Errorf("rebuild: commit up to %d: %w", cursor, err)
		}
		stats.Records += len(groups)
		stats.Entries += n
		groups, positions, n = nil, map[int]uint64{}, 0
		if opts.Progress != nil {
			opts.Progress(cursor, last)
		}
		return nil
	}
	for cursor < last {
		var it Item
		select {
		case <-ctx.Done():
			return stats, ctx.Err()
		case err := <-followErr:
			if err == nil || errors.Is(err, context.Canceled) {
				err = errors.New("the changelog ended early")
			}
			return stats, fmt.Errorf("rebuild: %w", err)
		case it = <-items:
		}
		stats.Messages++
		cursor = it.Seq
		switch {
		case it.Err != nil:
			stats.Skipped++
			continue
		case it.Record == nil:
			continue
		}
		if opts.UpTo != nil {
			if up, ok := opts.UpTo[it.Partition]; !ok || it.Seq > up {
				continue
			}
		}
		groups = append(groups, store.Group{At: it.Record.At, Entries: it.Record.Entries, Published: true})
		positions[it.Partition] = it.Seq
		n += len(it.Record.Entries)
		// Apply what has arrived rather than wait with work in hand: the
		// follower decodes the next records meanwhile.
		if n >= opts.BatchEntries || len(items) == 0 {
			if err := flush(); err != nil {
				return stats, err
			}
		}
	}
	if err := flush(); err != nil {
		return stats, err
	}
	if err := st.EndBulkLoad(ctx); err != nil {
		return stats, fmt.Errorf("rebuild: %w", err)
	}
	stats.Took = time.Since(t0)
	return stats, nil
}

// lastOfAll is the sequence of the last message of any of the partitions
// in s, 0 when they have none (LastOfEach: a file of 16 partitions asked
// one after the other waited 10 ms for them).
func lastOfAll(ctx context.Context, s jetstream.Stream, partitions []int) (uint64, error) {
	lasts, err := LastOfEach(ctx, s, partitions)
	if err != nil {
		return 0, err
	}
	return slices.Max(append(lasts, 0)), nil
}
