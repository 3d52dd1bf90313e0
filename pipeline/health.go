package pipeline

import (
	"sync"
	"time"
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
