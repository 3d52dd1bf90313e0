package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Defaults for RunPruner, for a service that has no reason to choose: the
// outbox and rejected payloads only help debugging after a week, and pruning
// hourly keeps each run short.
const (
	DefaultPruneInterval  = time.Hour
	DefaultPruneRetention = 7 * 24 * time.Hour
)

// PruneOptions says what Prune may forget. A zero time prunes nothing of
// that kind.
type PruneOptions struct {
	// PublishedEventsBefore: delete the outbox rows published before it. The
	// events table keeps every event for good; the outbox only has to
	// remember what is still to send, and a row not yet published is never
	// deleted.
	PublishedEventsBefore time.Time
	// RejectionsBefore: clear the payload prefix of the inputs rejected
	// (received) before it. The row itself stays, with its id, conversation,
	// status, reason, payload hash and size: it is what makes a redelivery
	// of that input a no-op and a reuse of its id detectable.
	RejectionsBefore time.Time
}

// PruneResult counts what one Prune removed.
type PruneResult struct {
	OutboxRows       int64 // published outbox rows deleted
	RejectedPayloads int64 // rejected inputs whose payload prefix was cleared
}

// pruneChunk bounds the rows one prune statement touches, so the single
// writer is never held for long while the pipeline waits to commit.
const pruneChunk = 2000

// Prune deletes published outbox rows and clears rejected inputs' payloads
// older than the cutoffs in opts. It never touches messages, events, applied
// inputs or unpublished outbox rows. It works in chunks of pruneChunk rows,
// each its own short transaction, and stops early with what it did so far
// when ctx ends or a chunk fails.
func (s *Store) Prune(ctx context.Context, opts PruneOptions) (PruneResult, error) {
	var res PruneResult
	if s.closed.Load() {
		return res, ErrClosed
	}
	if !opts.PublishedEventsBefore.IsZero() {
		n, err := s.pruneChunks(ctx, `DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox
			WHERE published_at IS NOT NULL AND published_at < ? ORDER BY seq LIMIT ?)`, opts.PublishedEventsBefore)
		res.OutboxRows = n
		if err != nil {
			return res, fmt.Errorf("prune outbox: %w", err)
		}
	}
	if !opts.RejectionsBefore.IsZero() {
		// The subquery matches the partial index inputs_rejected_payloads.
		n, err := s.pruneChunks(ctx, `UPDATE inputs SET payload = NULL WHERE rowid IN (SELECT rowid FROM inputs
			WHERE status = 'rejected' AND payload IS NOT NULL AND received_at < ? LIMIT ?)`, opts.RejectionsBefore)
		res.RejectedPayloads = n
		if err != nil {
			return res, fmt.Errorf("prune rejected payloads: %w", err)
		}
	}
	return res, nil
}

func (s *Store) pruneChunks(ctx context.Context, q string, before time.Time) (int64, error) {
	var total int64
	for {
		res, err := s.w.ExecContext(ctx, q, before.UnixMilli(), pruneChunk)
		if err != nil {
			return total, err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return total, err
		}
		total += n
		if n < pruneChunk {
			return total, nil
		}
	}
}

// RunPruner prunes every interval until ctx ends: published outbox rows and
// rejected payloads older than retention (by the store's clock). The first
// prune runs at once, so a service that restarts often still prunes. It logs
// what it pruned (at Info, only when something was) and failures (at Warn; the
// next tick tries again). log may be nil. every and retention must be
// positive, or RunPruner returns at once and logs why.
func RunPruner(ctx context.Context, s *Store, every, retention time.Duration, log *slog.Logger) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "pruner")
	if every <= 0 || retention <= 0 {
		log.Warn("pruner not started: interval and retention must be positive", "every", every, "retention", retention)
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	failing := false
	for {
		cutoff := s.now().Add(-retention)
		t0 := time.Now()
		res, err := s.Prune(ctx, PruneOptions{PublishedEventsBefore: cutoff, RejectionsBefore: cutoff})
		switch {
		case ctx.Err() != nil:
			if res.OutboxRows > 0 || res.RejectedPayloads > 0 {
				log.Info("pruned before stopping", "outbox_rows", res.OutboxRows, "rejected_payloads", res.RejectedPayloads)
			}
			return
		case errors.Is(err, ErrClosed):
			log.Info("pruner stopped: store closed")
			return
		case err != nil:
			failing = true
			log.Warn("prune failed; retrying at the next interval", "err", err, "retry_in", every,
				"outbox_rows", res.OutboxRows, "rejected_payloads", res.RejectedPayloads)
		case failing || res.OutboxRows > 0 || res.RejectedPayloads > 0:
			// After a failure, one line says pruning works again.
			failing = false
			log.Info("pruned", "outbox_rows", res.OutboxRows, "rejected_payloads", res.RejectedPayloads,
				"before", cutoff.UTC().Format(time.RFC3339), "took", time.Since(t0).Round(time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
