package pipeline

import (
	"context"
	"sync"
	"time"
)

// holding is which partitions this instance keeps the state of (owner or
// standby, Assign), and how far each one it gained is restored from the
// changelog. A partition is pulled only once restored: no input of it is
// applied on a copy that lacks records of the log.
//
// A gained partition is planned by the follower (plan): it reads the
// partition's last changelog message (the restore's target) and follows
// the partition from after the last record the store holds. It is restored
// once the committer has handled the target (progress). A partition this
// instance stops holding keeps its rows (history is never deleted) but is
// no longer followed; gaining it again catches up from the store's
// position.
type holding struct {
	mu       sync.Mutex
	held     []bool
	restored []bool
	// owner says the partition is held as its owner (pulled), not as a
	// standby.
	owner []bool
	// planned says the follower read the partition's target; target is its
	// last message then (0: none, nothing to restore).
	planned []bool
	target  []uint64
	// began is when the partition was gained, changes how many changes of
	// other writers were applied to it since (the restore's size).
	began   []time.Time
	changes []int
	// pending are the gained partitions the follower has not planned yet.
	pending []int
	// changed is kicked when a restore completes: the runner assigns again
	// (the partition may be pulled now).
	changed chan struct{}
	// done is closed and replaced whenever a restore completes.
	done chan struct{}
}

func newHolding(n int) *holding {
	return &holding{held: make([]bool, n), restored: make([]bool, n), planned: make([]bool, n), owner: make([]bool, n),
		target: make([]uint64, n), began: make([]time.Time, n), changes: make([]int, n),
		changed: make(chan struct{}, 1), done: make(chan struct{})}
}

// holdChange is what update changed.
type holdChange struct{ gained, dropped []int }

// update sets the partitions held, and those of them held as their owner.
func (h *holding) update(held, owner []bool) holdChange {
	h.mu.Lock()
	defer h.mu.Unlock()
	var c holdChange
	now := time.Now()
	copy(h.owner, owner)
	for p, want := range held {
		switch {
		case want && !h.held[p]:
			c.gained = append(c.gained, p)
			h.held[p], h.restored[p], h.planned[p], h.target[p] = true, false, false, 0
			h.began[p], h.changes[p] = now, 0
			h.pending = append(h.pending, p)
		case !want && h.held[p]:
			c.dropped = append(c.dropped, p)
			h.held[p], h.restored[p], h.planned[p] = false, false, false
		}
	}
	if len(c.dropped) > 0 {
		kept := h.pending[:0]
		for _, p := range h.pending {
			if h.held[p] {
				kept = append(kept, p)
			}
		}
		h.pending = kept
		close(h.done)
		h.done = make(chan struct{})
	}
	return c
}

// take hands a follower the gained partitions to plan, and every partition
// held, of those that mine accepts (its store file's): the others stay
// pending for their own follower.
func (h *holding) take(mine func(p int) bool) (gained, held []int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var rest []int
	for _, p := range h.pending {
		if mine(p) {
			gained = append(gained, p)
		} else {
			rest = append(rest, p)
		}
	}
	h.pending = rest
	for p, ok := range h.held {
		if ok && mine(p) {
			held = append(held, p)
		}
	}
	return gained, held
}

// untake gives back partitions the follower could not plan (the server did
// not answer): the next run plans them.
func (h *holding) untake(ps []int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, p := range ps {
		if h.held[p] && !h.planned[p] {
			h.pending = append(h.pending, p)
		}
	}
}

// plan records partition p's restore target; current says the store holds
// it already. It reports whether p is restored now.
func (h *holding) plan(p int, target uint64, current bool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.held[p] {
		return false
	}
	h.planned[p], h.target[p] = true, target
	if current {
		h.finish(p)
	}
	return h.restored[p]
}

// finish marks p restored; h.mu is held.
func (h *holding) finish(p int) {
	h.restored[p] = true
	close(h.done)
	h.done = make(chan struct{})
	select {
	case h.changed <- struct{}{}:
	default:
	}
}

// restore is a completed restore, for the log.
type restore struct {
	partition int
	target    uint64
	changes   int
	took      time.Duration
}

// progress tells that the committer has handled partition p's changelog up
// to seq, applying changes of other writers; it returns the restore this
// completes, if any.
func (h *holding) progress(p int, seq uint64, changes int) (restore, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if p < 0 || p >= len(h.held) || !h.held[p] || h.restored[p] {
		return restore{}, false
	}
	h.changes[p] += changes
	if !h.planned[p] || seq < h.target[p] {
		return restore{}, false
	}
	h.finish(p)
	return restore{partition: p, target: h.target[p], changes: h.changes[p], took: time.Since(h.began[p])}, true
}

// restoring lists the partitions planned and not restored yet.
func (h *holding) restoring() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []int
	for p := range h.held {
		if h.held[p] && h.planned[p] && !h.restored[p] {
			out = append(out, p)
		}
	}
	return out
}

// standing tells whether any partition is held as a standby: its records
// are other writers', which the follower then reads with their data.
func (h *holding) standing() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for p := range h.held {
		if h.held[p] && !h.owner[p] {
			return true
		}
	}
	return false
}

func (h *holding) isHeld(p int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return p >= 0 && p < len(h.held) && h.held[p]
}

func (h *holding) isRestored(p int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return p >= 0 && p < len(h.held) && h.held[p] && h.restored[p]
}

// counts is how many partitions are held, and how many of them restored.
func (h *holding) counts() (held, restored int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for p := range h.held {
		if h.held[p] {
			held++
			if h.restored[p] {
				restored++
			}
		}
	}
	return held, restored
}

// waitRestored waits until every partition held is restored.
func (h *holding) waitRestored(ctx context.Context) error {
	for {
		h.mu.Lock()
		all, done := true, h.done
		for p := range h.held {
			all = all && (!h.held[p] || h.restored[p])
		}
		h.mu.Unlock()
		if all {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-done:
		}
	}
}
