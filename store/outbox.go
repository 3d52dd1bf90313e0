package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Pending is the number of outbox rows not yet published, held rows
// (another writer's events) aside.
func (s *Store) Pending(ctx context.Context) (int, error) {
	var n int
	if err := s.r.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox WHERE published_at IS NULL AND held_since IS NULL").Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox pending: %w", err)
	}
	return n, nil
}

const qSetCursor = `INSERT INTO relay_cursor (id, stream_seq) VALUES (1, ?)
	ON CONFLICT (id) DO UPDATE SET stream_seq = excluded.stream_seq`

// markPublished marks outbox rows by seq and, when streamSeq is not 0, moves
// the relay cursor to it, in one transaction.
func (s *Store) markPublished(ctx context.Context, seqs []int64, streamSeq uint64) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("mark published: %w", err)
	}
	defer tx.Rollback()
	st, err := tx.PrepareContext(ctx, "UPDATE outbox SET published_at = ? WHERE seq = ?")
	if err != nil {
		return fmt.Errorf("mark published: %w", err)
	}
	now := s.now().UnixMilli()
	for _, seq := range seqs {
		if _, err := st.ExecContext(ctx, now, seq); err != nil {
			return fmt.Errorf("mark published seq %d: %w", seq, err)
		}
	}
	if streamSeq > 0 {
		if _, err := tx.ExecContext(ctx, qSetCursor, int64(streamSeq)); err != nil {
			return fmt.Errorf("mark published: cursor: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("mark published: %w", err)
	}
	return nil
}

// markPublishedIDs marks the pending outbox rows of the given event ids and
// sets the relay cursor to streamSeq, in one transaction. It returns how
// many rows it marked.
func (s *Store) markPublishedIDs(ctx context.Context, eventIDs []string, streamSeq uint64) (int, error) {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("mark published: %w", err)
	}
	defer tx.Rollback()
	st, err := tx.PrepareContext(ctx, "UPDATE outbox SET published_at = ? WHERE event_id = ? AND published_at IS NULL")
	if err != nil {
		return 0, fmt.Errorf("mark published: %w", err)
	}
	now := s.now().UnixMilli()
	n := 0
	for _, id := range eventIDs {
		res, err := st.ExecContext(ctx, now, id)
		if err != nil {
			return 0, fmt.Errorf("mark published %s: %w", id, err)
		}
		k, err := res.RowsAffected()
		if err != nil {
			return 0, fmt.Errorf("mark published %s: %w", id, err)
		}
		n += int(k)
	}
	// Set, not raised: a stream deleted and created again starts over.
	if _, err := tx.ExecContext(ctx, qSetCursor, int64(streamSeq)); err != nil {
		return 0, fmt.Errorf("mark published: cursor: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("mark published: %w", err)
	}
	return n, nil
}

// relayCursor is the stream sequence up to which the event stream and the
// outbox agree (0 before the first publish).
func (s *Store) relayCursor(ctx context.Context) (uint64, error) {
	var seq int64
	err := s.r.QueryRowContext(ctx, "SELECT stream_seq FROM relay_cursor WHERE id = 1").Scan(&seq)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("relay cursor: %w", err)
	}
	return uint64(seq), nil
}

// PruneOutbox deletes outbox rows published before t and returns how many.
// The events table keeps every event; the outbox only has to remember what
// is still to send.
func (s *Store) PruneOutbox(ctx context.Context, t time.Time) (int64, error) {
	res, err := s.w.ExecContext(ctx, "DELETE FROM outbox WHERE published_at IS NOT NULL AND published_at < ?", t.UnixMilli())
	if err != nil {
		return 0, fmt.Errorf("prune outbox: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("prune outbox: %w", err)
	}
	return n, nil
}
