package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ctxpipe/ctxpipe/internal/backoff"
)

// Publisher sends one event and returns its sequence in the event stream
// (CTX_EVENTS), or 0 when it cannot tell. msgID is the event id; the
// JetStream adapter passes it as Nats-Msg-Id (jetstream.WithMsgID) so a row
// published twice inside the stream's duplicate window is dropped by the
// stream; the sequence of a dropped copy is the original's.
type Publisher interface {
	Publish(ctx context.Context, subject string, data []byte, msgID string) (seq uint64, err error)
}

// ErrUnpublishable is wrapped by a Publisher's error when the message can
// never be published as it is (larger than the server or the stream takes).
// The relay then skips the row, logging it, rather than retry it for ever:
// rows are published in order, and one such row would hold back every
// later event of every conversation.
var ErrUnpublishable = errors.New("the event can never be published")

// RelayOptions tunes a Relay. Zero fields take the defaults.
type RelayOptions struct {
	PollInterval time.Duration // idle wait when no Notify comes (default 250ms)
	BatchSize    int           // rows read, published and marked per round (default 64)
	MinBackoff   time.Duration // first wait after a failure (default 50ms)
	MaxBackoff   time.Duration // longest wait between retries (default 5s)
	// DuplicateWindow is the event stream's duplicate window (default 2m,
	// bus.DuplicateWindow). A row is sent again without a look at the
	// stream only while its first attempt is younger than half of it; the
	// margin covers the time between the attempt and the stream storing it.
	DuplicateWindow time.Duration
	// Hold is how long at least a held row (Group.Held: another writer's
	// event) waits for its writer's relay before this one publishes it
	// (default 5s). Each relay adds a random part of it once, so that of
	// several instances holding the same event the first to end its hold
	// publishes it and the others find it in the stream.
	Hold time.Duration
}

// Relay publishes the outbox in seq order and marks what it published. Run
// it in one goroutine per store; Notify and Flush may be called from any.
//
// With a Publisher that is also a PublishedLister, each event reaches the
// stream once whatever the outage: on its first round with rows pending, and
// before re-sending a row first tried more than half a duplicate window ago,
// the relay reads the stream after its cursor (the sequence up to which the
// stream and the outbox are known to agree, stored with every mark) and marks
// the rows it finds there as published instead of sending them again.
type Relay struct {
	s      *Store
	pub    Publisher
	lister PublishedLister // nil: rely on the duplicate window alone
	log    *slog.Logger
	opts   RelayOptions

	// Used by Run's goroutine only.
	reconciled bool                // the stream was read since Run started
	attempts   map[int64]time.Time // outbox seq → first publish attempt, until marked
	scanner    PublishedScanner    // nil: held rows are published when their hold ends
	hold       time.Duration       // Hold and this relay's random part of it
	scanned    time.Time           // when the stream was last read for held rows

	kick chan struct{}
	mu   sync.Mutex
	prog chan struct{} // closed and replaced after every round

	skipped atomic.Int64 // rows that could never be published
}

// Skipped is how many events the relay gave up on because they can never
// be published (ErrUnpublishable).
func (r *Relay) Skipped() int64 { return r.skipped.Load() }

// NewRelay returns a Relay over s that publishes through pub. log may be nil.
func NewRelay(s *Store, pub Publisher, log *slog.Logger, opts RelayOptions) *Relay {
	if opts.PollInterval <= 0 {
		opts.PollInterval = 250 * time.Millisecond
	}
	if opts.BatchSize <= 0 {
		opts.BatchSize = 64
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 50 * time.Millisecond
	}
	if opts.MaxBackoff < opts.MinBackoff {
		opts.MaxBackoff = max(5*time.Second, opts.MinBackoff)
	}
	if opts.DuplicateWindow <= 0 {
		opts.DuplicateWindow = 2 * time.Minute
	}
	if opts.Hold <= 0 {
		opts.Hold = 5 * time.Second
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	lister, _ := pub.(PublishedLister)
	scanner, _ := pub.(PublishedScanner)
	return &Relay{s: s, pub: pub, lister: lister, scanner: scanner, hold: opts.Hold + rand.N(opts.Hold),
		log: log.With("component", "outbox_relay"), opts: opts,
		attempts: map[int64]time.Time{}, kick: make(chan struct{}, 1), prog: make(chan struct{})}
}

// Notify wakes the relay without blocking; the pipeline calls it after each
// commit that stored events, so they leave without waiting for the poll
// interval.
func (r *Relay) Notify() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Pending is the number of outbox rows not yet published, held rows aside.
func (r *Relay) Pending(ctx context.Context) (int, error) { return r.s.Pending(ctx) }

// Run publishes until ctx ends, then returns nil. It returns ErrClosed if the
// store is closed under it. Publish and database failures are logged and
// retried with exponential backoff from the same row, so order is kept.
func (r *Relay) Run(ctx context.Context) error {
	// Whatever happened before this Run, the stream may hold rows not
	// marked yet: read it back before the first publish.
	r.reconciled = false
	retries := backoff.New(backoff.Policy{First: r.opts.MinBackoff, Max: r.opts.MaxBackoff})
	failures := 0
	for {
		if r.s.closed.Load() {
			return ErrClosed
		}
		n, err := r.round(ctx)
		var released int
		var heldNext time.Time
		if err == nil {
			released, heldNext, err = r.releaseHeld(ctx)
		}
		r.progress()
		if ctx.Err() != nil {
			return nil
		}
		var wait time.Duration
		if err == nil && failures > 0 {
			// Every failure line gets its recovery line.
			r.log.Info("outbox relay recovered", "failed_rounds", failures, "published", n)
			failures = 0
		}
		switch {
		case err != nil:
			failures++
			wait = retries.Next()
			r.log.Warn("outbox relay round failed", "err", err, "retry_in", wait)
		case n >= r.opts.BatchSize || released > 0:
			retries.Reset()
			continue // more rows may be waiting, or waited behind the released ones
		default:
			retries.Reset()
			wait = r.opts.PollInterval
			if !heldNext.IsZero() {
				wait = max(min(wait, time.Until(heldNext)), time.Millisecond)
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-r.kick:
			// A kick ends an idle wait at once but never shortens a backoff:
			// commits keep coming while the publisher is down.
			if err != nil {
				select {
				case <-ctx.Done():
					t.Stop()
					return nil
				case <-t.C:
				}
			}
		case <-t.C:
		}
		t.Stop()
	}
}

type outboxRow struct {
	seq     int64
	eventID string
	subject string
	data    []byte
}

func (r *Relay) pending(ctx context.Context) ([]outboxRow, error) {
	// Not the held rows, nor a row behind a held row of its conversation
	// (held.go).
	return queryRows(ctx, r.s.r, "read outbox", func(rows *sql.Rows) (o outboxRow, err error) {
		err = rows.Scan(&o.seq, &o.eventID, &o.subject, &o.data)
		return o, err
	}, `SELECT seq, event_id, subject, data FROM outbox o
		WHERE published_at IS NULL AND held_since IS NULL AND NOT EXISTS (SELECT 1 FROM outbox h
			WHERE h.published_at IS NULL AND h.held_since IS NOT NULL AND h.conv = o.conv AND h.seq < o.seq)
		ORDER BY seq LIMIT ?`, r.opts.BatchSize)
}

// round publishes up to one batch and marks the published prefix in one
// transaction. It returns how many rows it published or found published.
func (r *Relay) round(ctx context.Context) (int, error) {
	batch, err := r.pending(ctx)
	if err != nil || len(batch) == 0 {
		if err == nil {
			// Nothing pending: nothing the stream could hold unmarked.
			r.reconciled = true
		}
		return 0, err
	}
	found := 0
	if r.needsReconcile(batch) {
		if found, err = r.reconcile(ctx); err != nil {
			return 0, err
		}
		if found > 0 {
			if batch, err = r.pending(ctx); err != nil || len(batch) == 0 {
				return found, err
			}
		}
	}
	var (
		done    []int64
		lastSeq uint64
		pubErr  error
	)
	for _, o := range batch {
		if _, ok := r.attempts[o.seq]; !ok {
			r.attempts[o.seq] = time.Now()
		}
		seq, err := r.pub.Publish(ctx, o.subject, o.data, o.eventID)
		if errors.Is(err, ErrUnpublishable) {
			// Marked as handled, with no stream sequence: it stays in the
			// events table (ctx.q.events), and the rows after it go out.
			r.log.Error("an event can never be published; skipped", "event_id", o.eventID, "subject", o.subject,
				"bytes", len(o.data), "err", err)
			r.skipped.Add(1)
			done = append(done, o.seq)
			continue
		}
		if err != nil {
			pubErr = fmt.Errorf("publish %s (seq %d) on %s: %w", o.eventID, o.seq, o.subject, err)
			break
		}
		done = append(done, o.seq)
		lastSeq = max(lastSeq, seq)
	}
	if len(done) > 0 {
		// Marking uses a fresh context: rows already published should be
		// marked even when ctx ended mid-batch, or they go out again.
		mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		err := r.s.markPublished(mctx, done, lastSeq)
		cancel()
		if err != nil {
			return 0, err
		}
		for _, seq := range done {
			delete(r.attempts, seq)
		}
	}
	return found + len(done), pubErr
}

// progress wakes every Flush waiting for the relay to move.
func (r *Relay) progress() {
	r.mu.Lock()
	close(r.prog)
	r.prog = make(chan struct{})
	r.mu.Unlock()
}

func (r *Relay) progressChan() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.prog
}

// Flush returns once every outbox row committed before the call has been
// published, or with ctx's error, held rows (another writer's events) aside.
// It needs Run to be running.
func (r *Relay) Flush(ctx context.Context) error {
	var target int64
	if err := r.s.r.QueryRowContext(ctx, "SELECT COALESCE(MAX(seq), 0) FROM outbox").Scan(&target); err != nil {
		return fmt.Errorf("flush outbox: %w", err)
	}
	for {
		prog := r.progressChan() // taken before the check so no round is missed
		var left int
		if err := r.s.r.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox WHERE published_at IS NULL AND held_since IS NULL AND seq <= ?",
			target).Scan(&left); err != nil {
			return fmt.Errorf("flush outbox: %w", err)
		}
		if left == 0 {
			return nil
		}
		r.Notify()
		select {
		case <-ctx.Done():
			return fmt.Errorf("flush outbox: %d events unpublished: %w", left, ctx.Err())
		case <-prog:
		}
	}
}
