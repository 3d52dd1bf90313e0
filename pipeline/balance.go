package pipeline

import (
	"context"
	"hash/fnv"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/ctxpipe/ctxpipe/bus"
)

// Members tells which instances are running (InstanceLock implements it).
type Members interface {
	Live(ctx context.Context) ([]string, error)
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
	mu       sync.Mutex
	owning   bool      // this instance holds the pin (received under it)
	since    time.Time // when the current term began
	stop     func()    // stops the partition's iterator; nil when none
	yielding bool      // stop was called to hand the partition over
}

func (s *partState) set(f func(*partState)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
}

// rebalance hands over, every RebalanceEvery, the partitions this instance
// owns that another live instance is preferred for (Preferred): it stops
// pulling them and asks the server to unpin it, so that the preferred
// instance, which pulls as a standby, gets them. Every instance pulls every
// partition, so whoever pulled first after a start holds many partitions;
// this spreads them. A partition is handed over only after its owner held it
// for a whole period, and only to an instance that refreshed its lock in the
// last seconds, so a dead instance is never handed anything.
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
		lctx, cancel := context.WithTimeout(ctx, r.cfg.RebalanceEvery)
		live, err := r.Members.Live(lctx)
		cancel()
		if err != nil {
			r.Log.Debug("cannot list instances", "err", err)
			continue
		}
		if !slices.Contains(live, r.cfg.Name) {
			live = append(live, r.cfg.Name)
		}
		if len(live) < 2 {
			continue
		}
		now := time.Now()
		for p := range r.parts {
			want := Preferred(p, live)
			if want == r.cfg.Name {
				continue
			}
			r.parts[p].set(func(s *partState) {
				if s.owning && !s.yielding && s.stop != nil && now.Sub(s.since) >= r.cfg.RebalanceEvery {
					s.yielding = true
					r.Log.Info("handing partition over", "partition", p, "to", want, "instances", len(live))
					s.stop()
				}
			})
		}
	}
}

// handOver finishes handing partition p over: unpin it so the server gives
// it to a standby at once (not after PinnedTTL), and stay away from it long
// enough for the standby to be pinned.
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
	select {
	case <-ctx.Done():
	case <-time.After(r.cfg.PinnedTTL + r.cfg.RebalanceEvery):
	}
	r.parts[p].set(func(s *partState) { s.yielding = false })
}
