package pipeline

import (
	"context"
	"slices"
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

// catchUp waits until every partition this instance holds is restored
// from the changelog (at most CatchUpTimeout), then lets it own partitions:
// a restarted instance that took its partitions back at once could only
// wait (or retry its inputs, fenced) until it had caught up, while the
// others could have applied them.
func (r *Runner) catchUp(ctx context.Context) {
	t0 := time.Now()
	wctx, cancel := context.WithTimeout(ctx, r.cfg.CatchUpTimeout)
	err := r.holds.waitRestored(wctx)
	cancel()
	if ctx.Err() != nil {
		return
	}
	held, restored := r.holds.counts()
	if err != nil {
		r.Log.Warn("not caught up with the changelog; taking partitions anyway", "held", held, "restored", restored, "err", err)
	} else {
		r.Log.Info("caught up with the changelog", "held", held, "took", time.Since(t0).Round(time.Millisecond))
	}
	r.caughtUp.Store(true)
	if r.Members != nil {
		r.Members.CaughtUp()
	}
	r.reassign()
}

// handled tells the partitions' holding that the committer handled p's
// changelog up to seq (changes applied with it), and logs the restore this
// completes, if any.
func (r *Runner) handled(p int, seq uint64, changes int) {
	if rs, done := r.holds.progress(p, seq, changes); done {
		r.restored(rs)
	}
}

// restored logs a completed restore; the partition may be pulled now.
func (r *Runner) restored(rs restore) {
	per10k := time.Duration(0)
	if rs.changes > 0 {
		per10k = rs.took * 10000 / time.Duration(rs.changes)
	}
	r.Metrics.Inc("ctxpipe_partitions_restored_total", "")
	r.Metrics.Observe("ctxpipe_partition_restore_seconds", "", rs.took)
	r.Log.Info("partition restored", "partition", rs.partition, "changelog_last", rs.target, "changes", rs.changes,
		"took", rs.took.Round(time.Millisecond), "per_10k_changes", per10k.Round(time.Millisecond))
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
	pullSince time.Time          // when the iterator stop stops began pulling
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
// holds (follows their changelog: owner or standby) and which it pulls:
// those it is preferred for (Assign), once restored. Only the preferred
// instance pulls a partition, so when it is pinned nobody takes the
// partition from it, and when an owner is not preferred (it pulled first,
// or the preferred one joined since) it hands the partition over: it stops
// pulling and unpins itself, and the one instance that does pull gets the
// pin. When an instance dies it drops out of the live list within seconds
// (its lock is refreshed every second), the next preferred instance starts
// pulling, once it holds the partition's state, and the server moves the
// pin once the dead one's lapsed (PinnedTTL).
func (r *Runner) assign(live []string) {
	r.assignMu.Lock()
	defer r.assignMu.Unlock()
	r.lastLive = slices.Clone(live)
	a := Assign(len(r.parts), live, r.cfg.Name, r.caughtUp.Load(), r.cfg.Standby)
	if c := r.holds.update(a.Held, a.Pull); len(c.gained) > 0 || len(c.dropped) > 0 {
		r.Log.Info("partitions held", "gained", c.gained, "dropped", c.dropped, "standby", r.cfg.Standby, "instances", len(live))
		for _, f := range r.followers {
			f.follow()
		}
	}
	defer r.syncOwned()
	for p := range r.parts {
		s := &r.parts[p]
		want := a.Pull[p] && r.holds.isRestored(p)
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

// reassign runs assign again with the live instances last listed.
func (r *Runner) reassign() {
	r.assignMu.Lock()
	live := r.lastLive
	r.assignMu.Unlock()
	r.assign(live)
}

// rebalance runs assign every RebalanceEvery with the live instances, and
// whenever a partition's restore completes.
func (r *Runner) rebalance(ctx context.Context) {
	t := time.NewTicker(r.cfg.RebalanceEvery)
	defer t.Stop()
	var failingSince time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.holds.changed:
			r.reassign()
			continue
		case <-t.C:
		}
		if r.Members == nil || r.cfg.Name == "" {
			r.reassign()
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, 2*r.cfg.RebalanceEvery)
		live, err := r.Members.Live(lctx)
		cancel()
		if err != nil {
			// Keep the last assignment: pulling on (or not) is safe,
			// and the fence keeps two writers apart.
			if failingSince.IsZero() {
				failingSince = time.Now()
				r.Log.Warn("cannot list the live instances; keeping the partitions as they are", "err", err)
			}
			continue
		}
		if !failingSince.IsZero() {
			r.Log.Info("listing the live instances again", "after", time.Since(failingSince).Round(time.Millisecond))
			failingSince = time.Time{}
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
