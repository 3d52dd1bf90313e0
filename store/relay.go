package store

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Publisher sends one event. msgID is the event id; the JetStream adapter
// passes it as Nats-Msg-Id (jetstream.WithMsgID) so a row published twice,
// after a crash between publish and mark, is dropped by the stream's dedup.
type Publisher interface {
	Publish(ctx context.Context, subject string, data []byte, msgID string) error
}

// RelayOptions tunes a Relay. Zero fields take the defaults.
type RelayOptions struct {
	PollInterval time.Duration // idle wait when no Notify comes (default 250ms)
	BatchSize    int           // rows read, published and marked per round (default 64)
	MinBackoff   time.Duration // first wait after a failure (default 50ms)
	MaxBackoff   time.Duration // longest wait between retries (default 5s)
}

// Relay publishes the outbox in seq order and marks what it published. Run
// it in one goroutine per store; Notify and Flush may be called from any.
type Relay struct {
	s    *Store
	pub  Publisher
	log  *slog.Logger
	opts RelayOptions

	kick chan struct{}
	mu   sync.Mutex
	prog chan struct{} // closed and replaced after every round
}

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
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Relay{s: s, pub: pub, log: log.With("component", "outbox_relay"), opts: opts,
		kick: make(chan struct{}, 1), prog: make(chan struct{})}
}

// Notify wakes the relay without blocking; the pipeline calls it after each
// commit so events leave without waiting for the poll interval.
func (r *Relay) Notify() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Pending is the number of outbox rows not yet published.
func (r *Relay) Pending(ctx context.Context) (int, error) { return r.s.Pending(ctx) }

// Run publishes until ctx ends, then returns nil. It returns ErrClosed if the
// store is closed under it. Publish and database failures are logged and
// retried with exponential backoff from the same row, so order is kept.
func (r *Relay) Run(ctx context.Context) error {
	backoff := time.Duration(0)
	for {
		if r.s.closed.Load() {
			return ErrClosed
		}
		n, err := r.round(ctx)
		r.progress()
		if ctx.Err() != nil {
			return nil
		}
		var wait time.Duration
		switch {
		case err != nil:
			backoff = min(max(2*backoff, r.opts.MinBackoff), r.opts.MaxBackoff)
			wait = backoff
			r.log.Warn("outbox relay round failed", "err", err, "retry_in", wait)
		case n == r.opts.BatchSize:
			backoff = 0
			continue // more rows may be waiting
		default:
			backoff = 0
			wait = r.opts.PollInterval
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

// round publishes up to one batch and marks the published prefix in one
// transaction. It returns how many rows it published.
func (r *Relay) round(ctx context.Context) (int, error) {
	rows, err := r.s.r.QueryContext(ctx, `SELECT seq, event_id, subject, data FROM outbox
		WHERE published_at IS NULL ORDER BY seq LIMIT ?`, r.opts.BatchSize)
	if err != nil {
		return 0, fmt.Errorf("read outbox: %w", err)
	}
	var batch []outboxRow
	for rows.Next() {
		var o outboxRow
		if err := rows.Scan(&o.seq, &o.eventID, &o.subject, &o.data); err != nil {
			rows.Close()
			return 0, fmt.Errorf("read outbox: %w", err)
		}
		batch = append(batch, o)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("read outbox: %w", err)
	}
	var done []int64
	var pubErr error
	for _, o := range batch {
		if err := r.pub.Publish(ctx, o.subject, o.data, o.eventID); err != nil {
			pubErr = fmt.Errorf("publish %s (seq %d) on %s: %w", o.eventID, o.seq, o.subject, err)
			break
		}
		done = append(done, o.seq)
	}
	if len(done) > 0 {
		// Marking uses a fresh context: rows already published should be
		// marked even when ctx ended mid-batch, or they go out again.
		mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		err := r.s.markPublished(mctx, done)
		cancel()
		if err != nil {
			return 0, err
		}
	}
	return len(done), pubErr
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
// published, or with ctx's error. It needs Run to be running.
func (r *Relay) Flush(ctx context.Context) error {
	var target int64
	if err := r.s.r.QueryRowContext(ctx, "SELECT COALESCE(MAX(seq), 0) FROM outbox").Scan(&target); err != nil {
		return fmt.Errorf("flush outbox: %w", err)
	}
	for {
		prog := r.progressChan() // taken before the check so no round is missed
		var left int
		if err := r.s.r.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox WHERE published_at IS NULL AND seq <= ?",
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

// Pending is the number of outbox rows not yet published.
func (s *Store) Pending(ctx context.Context) (int, error) {
	var n int
	if err := s.r.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox WHERE published_at IS NULL").Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox pending: %w", err)
	}
	return n, nil
}

func (s *Store) markPublished(ctx context.Context, seqs []int64) error {
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
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("mark published: %w", err)
	}
	return nil
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
