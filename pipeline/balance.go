package pipeline

import (
	"context"
	"hash/fnv"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
)

// Members tells which instances are running and may own partitions
// (InstanceLock implements it).
type Members interface {
	Live(ctx context.Context) ([]string, error)
	// CaughtUp tells the others that this instance's follower has reached
	// the end the changelog had when it started: it may own partitions.
	CaughtUp()
}

// catchUp waits until the follower has reached the end CTX_STATE had when
// the runner started (at most CatchUpTimeout), then lets this instance own
// partitions: a restarted instance that took its partitions back at once
// could only retry its inputs (fenced) until it had caught up, while the
// others could have applied them.
func (r *Runner) catchUp(ctx context.Context) {
	t0 := time.Now()
	var last uint64
	err := bus.RetryStart(ctx, r.Log, "read "+bus.StreamState, func(ctx context.Context) error {
		s, err := r.JS.Stream(ctx, bus.StreamState)
		if err == nil {
			last = s.CachedInfo().State.LastSeq
		}
		return err
	})
	if err == nil {
		wctx, cancel := context.WithTimeout(ctx, r.cfg.CatchUpTimeout)
		err = r.log.waitCursor(wctx, last)
		cancel()
	}
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		r.Log.Warn("not caught up with the changelog; taking partitions anyway", "changelog_last", last, "cursor", r.Cursor(), "err", err)
	} else {
		r.Log.Info("caught up with the changelog", "changelog_last", last, "took", time.Since(t0).Round(time.Millisecond))
	}
	r.caughtUp.Store(true)
	if r.Members != nil {
		r.Members.CaughtUp()
	}
}

// Preferred is the instance that should own partition p among members:
// rendezvous hashing, so every instance computes the same answer from the
// same list, the partitions spread evenly, and an instance joining or
// leaving moves only its own share.
func Preferred(p int, members []string) string {
	var best string
	var top uint64
	for _, m := range members {
		h := fnv.New64a()
		h.Write([]byte(m))
		h.Write([]byte{0})
		h.Write([]byte(strconv.Itoa(p)))
		// FNV's last bytes reach only the low half of the sum: without a
		// finalizer the name alone would decide the top bits, and one
		// instance would be preferred for nearly every partition.
		if v := mix64(h.Sum64()); best == "" || v > top || (v == top && m < best) {
			best, top = m, v
		}
	}
	return best
}

// mix64 is SplitMix64's finalizer: every input bit flips about half of
// the output bits.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// partState is what the runner knows of one partition's ownership.
type partState struct {
	// want says whether this instance should pull the partition: it is
	// the preferred one among the live instances (always, without
	// Members). wake is signalled when want turns true.
	want atomic.Bool
	wake chan struct{}

	mu        sync.Mutex
	cons      jetstream.Consumer // made at start, taken by the first pull
	owning    bool               // this instance holds the pin (received under it)
	lastInput time.Time          // when the last input came under the pin
	stop      func()             // stops the partition's iterator; nil when none
	yielding  bool               // stop was called to hand the partition over
}

func newPartStates(n int, want bool) []partState {
	ps := make([]partState, n)
	for i := range ps {
		ps[i].wake = make(chan struct{}, 1)
		ps[i].want.Store(want)
	}
	return ps
}

func (s *partState) set(f func(*partState)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
}

// waitWanted blocks until this instance should pull the partition.
func (s *partState) waitWanted(ctx context.Context) bool {
	for !s.want.Load() {
		select {
		case <-ctx.Done():
			return false
		case <-s.wake:
		}
	}
	return true
}

// assign decides, from the live instances, which partitions this instance
// pulls: those it is preferred for (Preferred). Only the preferred instance
// pulls a partition, so when it is pinned nobody takes the partition from it,
// and when an owner is not preferred (it pulled first, or the preferred one
// joined since) it hands the partition over: it stops pulling and unpins
// itself, and the one instance that does pull gets the pin. When an
// instance dies it drops out of the live list within seconds (its lock is
// refreshed every second), the next preferred instance starts pulling, and
// the server moves the pin once the dead one's lapsed (PinnedTTL).
func (r *Runner) assign(live []string) {
	// Live leaves out the instances still catching up with the changelog,
	// this one included: it takes no partition from the others before it
	// has, but when nobody else runs, somebody must pull.
	if !slices.Contains(live, r.cfg.Name) && (r.caughtUp.Load() || len(live) == 0) {
		live = append(live, r.cfg.Name)
	}
	for p := range r.parts {
		s := &r.parts[p]
		want := Preferred(p, live) == r.cfg.Name
		if s.want.Swap(want) == want {
			continue
		}
		if want {
			select {
			case s.wake <- struct{}{}:
			default:
			}
			continue
		}
		s.set(func(s *partState) {
			if s.stop != nil {
				s.yielding = s.owning
				if s.owning {
					r.Log.Info("handing partition over", "partition", p, "to", Preferred(p, live), "instances", len(live))
				}
				s.stop()
			}
		})
	}
}

// rebalance runs assign every RebalanceEvery with the live instances.
func (r *Runner) rebalance(ctx context.Context) {
	if r.Members == nil || r.cfg.Name == "" {
		return
	}
	t := time.NewTicker(r.cfg.RebalanceEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		lctx, cancel := context.WithTimeout(ctx, 2*r.cfg.RebalanceEvery)
		live, err := r.Members.Live(lctx)
		cancel()
		if err != nil {
			// Keep the last assignment: pulling on (or not) is safe,
			// and the fence keeps two writers apart.
			r.Log.Debug("cannot list instances", "err", err)
			continue
		}
		r.assign(live)
	}
}

// handOver finishes handing partition p over: unpin it so that the server
// gives it to the instance now pulling it at once, not after PinnedTTL.
func (r *Runner) handOver(ctx context.Context, p int) {
	uctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	s, err := r.JS.Stream(uctx, bus.StreamIn)
	if err == nil {
		err = s.UnpinConsumer(uctx, bus.ConsumerFor(r.cfg.Consumer, p), PriorityGroup)
	}
	cancel()
	if err != nil {
		r.Log.Debug("unpin failed; the pin lapses by itself", "partition", p, "err", err)
	}
	r.Metrics.Inc("ctxpipe_partitions_handed_over_total", "")
	r.parts[p].set(func(s *partState) { s.yielding = false })
}
