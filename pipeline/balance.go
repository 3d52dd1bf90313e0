package pipeline

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Members tells which instances are running and may own partitions
// (InstanceLock implements it).
type Members interface {
	Live(ctx context.Context) ([]string, error)
	// CaughtUp tells the others that this instance's follower has reached
	// the end the changelog had when it started: it may own partitions.
	CaughtUp()
}

// ownership is what this instance does with each partition: which it holds
// (keeps the state of, as owner or standby: holding) and which it pulls
// (partState.want), decided by Assign from the live instances, and what it
// knows of each partition's consumption (partState). The runner's
// partition loops pull what it wants, the follower follows what it holds,
// and the query server answers for what it pulls.
type ownership struct {
	name    string // Config.Name
	standby int
	// rebalanceEvery and catchUpTimeout are Config's.
	rebalanceEvery, catchUpTimeout time.Duration
	members                        Members // optional
	logger                         *slog.Logger
	metrics                        *Metrics
	// heldChanged is told when the partitions held change (the followers
	// follow the new set), pullChanged after every assignment (the query
	// server serves the partitions pulled).
	heldChanged, pullChanged func()

	// n is N (0 before publish); parts and holds have N+1 entries.
	n        atomic.Int64
	parts    []partState
	holds    *holding
	caughtUp atomic.Bool
	// assignMu serializes assign; lastLive is the live list it last had.
	assignMu sync.Mutex
	lastLive []string
}

// init sizes the ownership for n partitions (and the shared one), none
// held or pulled yet; publish makes n known to other goroutines once the
// runner is set up (partitions is 0 until then).
func (o *ownership) init(n int) {
	o.parts = newPartStates(n+1, false)
	o.holds = newHolding(n + 1)
}

func (o *ownership) publish(n int) { o.n.Store(int64(n)) }

// catchUp waits until every partition this instance holds is restored
// from the changelog (at most CatchUpTimeout), then lets it own partitions:
// a restarted instance that took its partitions back at once could only
// wait (or retry its inputs, fenced) until it had caught up, while the
// others could have applied them.
func (o *ownership) catchUp(ctx context.Context) {
	t0 := time.Now()
	wctx, cancel := context.WithTimeout(ctx, o.catchUpTimeout)
	err := o.holds.waitRestored(wctx)
	cancel()
	if ctx.Err() != nil {
		return
	}
	held, restored := o.holds.counts()
	if err != nil {
		o.logger.Warn("not caught up with the changelog; taking partitions anyway", "held", held, "restored", restored, "err", err)
	} else {
		o.logger.Info("caught up with the changelog", "held", held, "took", time.Since(t0).Round(time.Millisecond))
	}
	o.caughtUp.Store(true)
	if o.members != nil {
		o.members.CaughtUp()
	}
	o.reassign()
}

// handled tells the partitions' holding that the committer handled p's
// changelog up to seq (changes applied with it), and logs the restore this
// completes, if any.
func (o *ownership) handled(p int, seq uint64, changes int) {
	if rs, done := o.holds.progress(p, seq, changes); done {
		o.restored(rs)
	}
}

// restored logs a completed restore; the partition may be pulled now.
func (o *ownership) restored(rs restore) {
	per10k := time.Duration(0)
	if rs.changes > 0 {
		per10k = rs.took * 10000 / time.Duration(rs.changes)
	}
	o.metrics.Inc("ctxpipe_partitions_restored_total", "")
	o.metrics.Observe("ctxpipe_partition_restore_seconds", "", rs.took)
	o.logger.Info("partition restored", "partition", rs.partition, "changelog_last", rs.target, "changes", rs.changes,
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
func (o *ownership) assign(live []string) {
	o.assignMu.Lock()
	defer o.assignMu.Unlock()
	o.lastLive = slices.Clone(live)
	a := Assign(len(o.parts), live, o.name, o.caughtUp.Load(), o.standby)
	if c := o.holds.update(a.Held, a.Pull); len(c.gained) > 0 || len(c.dropped) > 0 {
		o.logger.Info("partitions held", "gained", c.gained, "dropped", c.dropped, "standby", o.standby, "instances", len(live))
		o.heldChanged()
	}
	defer o.pullChanged()
	for p := range o.parts {
		s := &o.parts[p]
		want := a.Pull[p] && o.holds.isRestored(p)
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
					o.logger.Info("handing partition over", "partition", p, "to", Preferred(p, live), "instances", len(live))
				}
				s.stop()
			}
		})
	}
}

// reassign runs assign again with the live instances last listed.
func (o *ownership) reassign() {
	o.assignMu.Lock()
	live := o.lastLive
	o.assignMu.Unlock()
	o.assign(live)
}

// rebalance runs assign every RebalanceEvery with the live instances, and
// whenever a partition's restore completes.
func (o *ownership) rebalance(ctx context.Context) {
	t := time.NewTicker(o.rebalanceEvery)
	defer t.Stop()
	var failingSince time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-o.holds.changed:
			o.reassign()
			continue
		case <-t.C:
		}
		if o.members == nil || o.name == "" {
			o.reassign()
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, 2*o.rebalanceEvery)
		live, err := o.members.Live(lctx)
		cancel()
		if err != nil {
			// Keep the last assignment: pulling on (or not) is safe,
			// and the fence keeps two writers apart.
			if failingSince.IsZero() {
				failingSince = time.Now()
				o.logger.Warn("cannot list the live instances; keeping the partitions as they are", "err", err)
			}
			continue
		}
		if !failingSince.IsZero() {
			o.logger.Info("listing the live instances again", "after", time.Since(failingSince).Round(time.Millisecond))
			failingSince = time.Time{}
		}
		o.assign(live)
	}
}

// pullStarts is, for each partition this instance pulls, when its current
// iterator began pulling.
func (o *ownership) pullStarts() []time.Time {
	var out []time.Time
	for p := range o.parts {
		o.parts[p].set(func(s *partState) {
			if s.stop != nil {
				out = append(out, s.pullSince)
			}
		})
	}
	return out
}

// ownedWithin is how recent a partition's last input must be for owned to
// count it: a pin that moved away leaves no trace on this side.
const ownedWithin = 30 * time.Second

// owned is how many partitions this instance received inputs for, under
// its pin, in the last ownedWithin.
func (o *ownership) owned() int {
	if o.n.Load() == 0 {
		return 0
	}
	n, now := 0, time.Now()
	for p := range o.parts {
		o.parts[p].set(func(s *partState) {
			if s.owning && now.Sub(s.lastInput) < ownedWithin {
				n++
			}
		})
	}
	return n
}

// partitions is N, 0 before publish.
func (o *ownership) partitions() int { return int(o.n.Load()) }

// answered lists the partitions this instance answers queries for.
func (o *ownership) answered() []int {
	if o.n.Load() == 0 {
		return nil
	}
	var out []int
	for p := range o.parts {
		if o.parts[p].want.Load() {
			out = append(out, p)
		}
	}
	return out
}

// answersHere tells whether this instance answers queries of partition p
// itself: it owns the partition (pulls it, restored), so that what it
// answers is what the partition's inputs made, not a standby's copy a few
// records behind (an agent reading right after its wait_for would see its
// turn go missing). Before it has read N, and for a partition it does not
// know, the local answer is as good as any.
func (o *ownership) answersHere(p int) bool {
	n := o.partitions()
	return n == 0 || p < 0 || p > n || o.parts[p].want.Load()
}

// strayPartition is the partition a stray's rejection is committed to, or
// -1. A stray belongs to none: any partition this instance pulls (so holds
// and follows) takes it, one it holds the pin of first, where no other
// writer's appends race it.
func (o *ownership) strayPartition() int {
	first := -1
	for p := range o.parts {
		if !o.parts[p].want.Load() {
			continue
		}
		owning := false
		o.parts[p].set(func(s *partState) { owning = s.owning })
		if owning {
			return p
		}
		if first < 0 {
			first = p
		}
	}
	return first
}
