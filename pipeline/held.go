package pipeline

import (
	"log/slog"
	"sync"
	"time"
)

// heldInputs are the fetched inputs not yet acked or given back: their
// payload bytes are bounded (Config.MaxHeldBytes), and each is kept alive
// on the server with in-progress acks while it is held (heartbeat).
type heldInputs struct {
	maxBytes int
	ackWait  time.Duration // Config.AckWait
	logger   *slog.Logger

	mu        sync.Mutex
	jobs      map[*job]struct{}
	bytes     int
	roomFreed *sync.Cond // signalled when held bytes go down
}

func newHeldInputs(maxBytes int, ackWait time.Duration, logger *slog.Logger) *heldInputs {
	h := &heldInputs{maxBytes: maxBytes, ackWait: ackWait, logger: logger, jobs: map[*job]struct{}{}}
	h.roomFreed = sync.NewCond(&h.mu)
	return h
}

// hold registers a fetched input. The scheduler never blocks the
// dispatcher, so this is where memory is bounded: past MaxHeldBytes the
// dispatcher waits for the workers to ack (one input is always let through,
// however large).
func (h *heldInputs) hold(j *job) {
	n := len(j.msg.Data())
	h.mu.Lock()
	for h.bytes > 0 && h.bytes+n > h.maxBytes {
		h.roomFreed.Wait()
	}
	h.jobs[j] = struct{}{}
	h.bytes += n
	h.mu.Unlock()
}

func (h *heldInputs) release(j *job) {
	h.mu.Lock()
	if _, ok := h.jobs[j]; ok {
		delete(h.jobs, j)
		h.bytes -= len(j.msg.Data())
		h.roomFreed.Broadcast()
	}
	h.mu.Unlock()
}

// count is how many fetched inputs are not yet acked or given back.
func (h *heldInputs) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.jobs)
}

// heartbeat sends in-progress acks for every input held longer than a third
// of the ack wait: queued behind a slow condense or being condensed, an
// input must not be redelivered.
func (h *heldInputs) heartbeat(done <-chan struct{}) {
	every := h.ackWait / 3
	t := time.NewTicker(every / 2)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case now := <-t.C:
			h.mu.Lock()
			var due []*job
			for j := range h.jobs {
				if now.Sub(j.touched) >= every {
					j.touched = now
					due = append(due, j)
				}
			}
			h.mu.Unlock()
			for _, j := range due {
				if err := j.msg.InProgress(); err != nil {
					h.logger.Debug("in-progress ack failed", "seq", j.seq, "err", err)
				}
			}
		}
	}
}
