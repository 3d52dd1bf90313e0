package store

import (
	"context"
	"fmt"
	"time"
)

// PublishedMsg is one message the event stream holds.
type PublishedMsg struct {
	MsgID string // its Nats-Msg-Id: the event id
	Seq   uint64 // its stream sequence
}

// PublishedLister reads back what the event stream holds, so the relay can
// find the events it published but did not mark (a crash between the ack and
// the mark, or a lost ack) after the stream's duplicate window has forgotten
// their ids. A Publisher that also implements it (pipeline.JetStreamPublisher
// does) gets this dedup beyond the window.
type PublishedLister interface {
	// PublishedAfter returns the stream's messages with a sequence above
	// seq, in order, up to last, the stream's last sequence when the call
	// began. It may read a bounded number of them, the newest.
	PublishedAfter(ctx context.Context, seq uint64) (msgs []PublishedMsg, last uint64, err error)
}

// needsReconcile tells whether the stream may hold a row of batch that the
// duplicate window would no longer catch: on the first round with rows
// pending (a crash may have come between an ack and its mark), and when a
// row was first tried more than half a window ago.
func (r *Relay) needsReconcile(batch []outboxRow) bool {
	if r.lister == nil {
		return false
	}
	if !r.reconciled {
		return true
	}
	for _, o := range batch {
		if t, ok := r.attempts[o.seq]; ok && time.Since(t) >= r.opts.DuplicateWindow/2 {
			return true
		}
	}
	return false
}

// reconcile reads the stream after the cursor, marks as published every
// pending row whose event it holds, and moves the cursor to the stream's
// end. It returns how many rows it marked.
func (r *Relay) reconcile(ctx context.Context) (int, error) {
	cursor, err := r.s.relayCursor(ctx)
	if err != nil {
		return 0, err
	}
	msgs, last, err := r.lister.PublishedAfter(ctx, cursor)
	if err != nil {
		return 0, fmt.Errorf("read event stream after seq %d: %w", cursor, err)
	}
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.MsgID
	}
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	n, err := r.s.markPublishedIDs(mctx, ids, last)
	cancel()
	if err != nil {
		return 0, err
	}
	r.reconciled = true
	// Every row still pending is now known not to be in the stream: its
	// next attempt starts a fresh window.
	clear(r.attempts)
	if n > 0 {
		r.log.Info("outbox rows found in the event stream, marked published instead of sent again",
			"rows", n, "after_seq", cursor, "stream_last_seq", last, "scanned", len(msgs))
	} else {
		r.log.Debug("event stream read; no pending outbox row in it", "after_seq", cursor, "stream_last_seq", last, "scanned", len(msgs))
	}
	return n, nil
}
