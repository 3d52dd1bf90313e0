package pipeline

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ctxpipe/ctxpipe/bus"
)

// health is what the runner knows about its own consumption, for /readyz
// and the last-fetch-age gauge.
type health struct {
	mu        sync.Mutex
	consuming bool      // an iterator is open on a consumer that exists
	lastWord  time.Time // last message or successful consumer check
	lastErr   error
	done      bool
}

func (h *health) up() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.consuming, h.lastErr, h.lastWord = true, nil, time.Now()
}

func (h *health) stopped() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.consuming, h.done = false, true
}

func (h *health) fetched(now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lastWord, h.lastErr = now, nil
}

func (h *health) probeFailed(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lastErr = err
}

// fetchAge is the time since the runner last heard from its consumer.
func (h *health) fetchAge(now time.Time) (time.Duration, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lastWord.IsZero() {
		return 0, false
	}
	return now.Sub(h.lastWord), true
}

// ready is true while an iterator is open and the consumer was heard from
// within maxAge; otherwise the reason says why not.
func (h *health) ready(now time.Time, maxAge time.Duration) (bool, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.done:
		return false, "runner stopped"
	case !h.consuming && h.lastErr != nil:
		return false, "consumer down: " + h.lastErr.Error()
	case !h.consuming:
		return false, "consumer not started"
	case now.Sub(h.lastWord) > maxAge:
		msg := "no word from the consumer for " + now.Sub(h.lastWord).Round(time.Second).String()
		if h.lastErr != nil {
			msg += ": " + h.lastErr.Error()
		}
		return false, msg
	}
	return true, "consuming"
}

// storeHealth is what the committers know of the store as a whole, for
// /readyz: whether the changelog lost records this store applied, and
// whether commits fail as a whole.
type storeHealth struct {
	// lostAt is when an append last found records this store applied gone
	// from CTX_STATE (UnixNano; 0: never): nothing can be committed until an
	// operator restores the stream.
	lostAt atomic.Int64
	// failedAt is when a commit last failed as a whole (UnixNano; 0: since
	// the last success), and why: SQLite cannot write (a full disk, a
	// broken file), nothing commits.
	failedAt atomic.Int64
	why      atomic.Value // string
}

// lose records that the changelog lost records this store applied; it
// reports whether that is news (never recorded before).
func (s *storeHealth) lose() bool { return s.lostAt.Swap(time.Now().UnixNano()) == 0 }

// failing records that a commit failed as a whole; works that one
// succeeded.
func (s *storeHealth) failing(err error) {
	s.why.Store(err.Error())
	s.failedAt.Store(time.Now().UnixNano())
}

func (s *storeHealth) works() { s.failedAt.Store(0) }

// ready is false, with the reason, while the changelog lost records or a
// commit failed within maxAge of now.
func (s *storeHealth) ready(now time.Time, maxAge time.Duration) (bool, string) {
	if t := s.lostAt.Load(); t != 0 && now.Sub(time.Unix(0, t)) < maxAge {
		return false, "the changelog lost records this store applied (CTX_STATE purged or recreated?): nothing can be committed until it is restored (operations.md 4.2)"
	}
	if t := s.failedAt.Load(); t != 0 && now.Sub(time.Unix(0, t)) < maxAge {
		why, _ := s.why.Load().(string)
		return false, "the store cannot commit: " + why
	}
	return true, ""
}

// probe asks the server about CTX_IN and CTX_STATE every ProbeInterval. An
// idle partition sends nothing but heartbeats, and a stream without a
// leader stores no new input: without this the runner could not tell an
// idle service from one that cannot work.
func (r *Runner) probe(ctx context.Context) {
	t := time.NewTicker(r.cfg.ProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, r.cfg.ProbeInterval)
		err := r.check(pctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			r.health.probeFailed(err)
		default:
			r.health.fetched(time.Now())
		}
	}
}

func (r *Runner) check(ctx context.Context) error {
	for _, name := range []string{bus.StreamIn, bus.StreamState} {
		s, err := r.JS.Stream(ctx, name)
		if err != nil {
			return fmt.Errorf("stream %s info: %w", name, err)
		}
		if c := s.CachedInfo().Cluster; c != nil && c.Leader == "" {
			return fmt.Errorf("stream %s has no leader", name)
		}
	}
	if n := r.failing.Load(); n > 0 {
		return fmt.Errorf("%d partition consumers are being rebuilt", n)
	}
	return nil
}
