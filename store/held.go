package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// An event of another writer's changelog record (Group.Held) is its
// writer's to publish: every live subscriber of ctx.events.> receives each
// publish, whatever the stream then drops as a copy, so a follower that
// published it too sent one copy per instance. The follower's relay holds
// the row back instead, reads the stream's messages from the record's
// commit time on, marks the rows it finds there as published, and
// publishes a row only when its hold ends and the stream still lacks it:
// the writer died before its relay sent it.
//
// A row of this instance waits behind a held row of its conversation (the
// new owner after a takeover), so that the conversation's events reach the
// stream in commit order.

// PublishedScanner is implemented by a Publisher that can list the event
// stream's messages stored since a time (pipeline.JetStreamPublisher
// does). Without it a held row is published when its hold ends.
type PublishedScanner interface {
	PublishedSince(ctx context.Context, t time.Time) ([]PublishedMsg, error)
}

const (
	// heldScanEvery is how often the relay reads the stream while rows are
	// held: a row of this instance behind a held row the writer published
	// waits at most that long.
	heldScanEvery = time.Second
	// heldScanMargin is read before the oldest held row's commit time: the
	// commit time is the writer's clock, the stream's are the servers'.
	heldScanMargin = 2 * time.Second
)

// heldRow is a held outbox row.
type heldRow struct {
	outboxRow
	since int64 // the record's commit time, Unix milliseconds
}

// releaseHeld marks the held rows the stream holds as published, and
// publishes those whose hold ended that it does not hold. It returns how
// many rows it marked or published, and when it should run again (zero
// when no row is held).
func (r *Relay) releaseHeld(ctx context.Context) (int, time.Time, error) {
	var oldest *int64
	if err := r.s.r.QueryRowContext(ctx, `SELECT MIN(held_since) FROM outbox
		WHERE published_at IS NULL AND held_since IS NOT NULL`).Scan(&oldest); err != nil {
		return 0, time.Time{}, fmt.Errorf("read held outbox rows: %w", err)
	}
	if oldest == nil {
		return 0, time.Time{}, nil
	}
	now := time.Now()
	next := time.UnixMilli(*oldest).Add(r.hold) // the oldest row's hold ends
	if scan := r.scanned.Add(heldScanEvery); scan.Before(next) {
		next = scan
	}
	if now.Before(next) {
		return 0, next, nil
	}
	held, err := r.heldRows(ctx)
	if err != nil {
		return 0, time.Time{}, err
	}
	found := map[string]bool{}
	if r.scanner != nil {
		msgs, err := r.scanner.PublishedSince(ctx, time.UnixMilli(*oldest).Add(-heldScanMargin))
		if err != nil {
			return 0, time.Time{}, fmt.Errorf("read event stream for held events: %w", err)
		}
		for _, m := range msgs {
			found[m.MsgID] = true
		}
	}
	r.scanned = now
	var marked, done []int64
	var send []heldRow
	next = now.Add(heldScanEvery)
	for _, h := range held {
		end := time.UnixMilli(h.since).Add(r.hold)
		switch {
		case found[h.eventID]:
			marked = append(marked, h.seq)
		case !end.After(now):
			send = append(send, h)
		case end.Before(next):
			next = end
		}
	}
	if len(marked) > 0 {
		mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		err := r.s.markPublished(mctx, marked, 0)
		cancel()
		if err != nil {
			return 0, time.Time{}, err
		}
	}
	var pubErr error
	for _, h := range send {
		if err := r.s.r.QueryRowContext(ctx, "SELECT subject, data FROM outbox WHERE seq = ?", h.seq).Scan(&h.subject, &h.data); err != nil {
			pubErr = fmt.Errorf("read held outbox row %d: %w", h.seq, err)
			break
		}
		_, err := r.pub.Publish(ctx, h.subject, h.data, h.eventID)
		if err != nil && !errors.Is(err, ErrUnpublishable) {
			pubErr = fmt.Errorf("publish held %s (seq %d) on %s: %w", h.eventID, h.seq, h.subject, err)
			break
		}
		if err != nil {
			r.log.Error("an event can never be published; skipped", "event_id", h.eventID, "subject", h.subject,
				"bytes", len(h.data), "err", err)
			r.skipped.Add(1)
		}
		done = append(done, h.seq)
	}
	if len(done) > 0 {
		r.log.Warn("events of another writer missing from the event stream when their hold ended; published",
			"events", len(done), "hold", r.hold.Round(time.Millisecond))
		mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		err := r.s.markPublished(mctx, done, 0)
		cancel()
		if err != nil {
			return 0, time.Time{}, err
		}
	}
	return len(marked) + len(done), next, pubErr
}

// heldRows reads the held rows, in seq order, without their subject and
// data.
func (r *Relay) heldRows(ctx context.Context) ([]heldRow, error) {
	return queryRows(ctx, r.s.r, "read held outbox rows", func(rows *sql.Rows) (h heldRow, err error) {
		err = rows.Scan(&h.seq, &h.eventID, &h.since)
		return h, err
	}, `SELECT seq, event_id, held_since FROM outbox
		WHERE published_at IS NULL AND held_since IS NOT NULL ORDER BY seq`)
}
