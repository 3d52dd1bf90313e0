package pipeline

import (
	"context"
	"time"

	"github.com/ctxpipe/ctxpipe/bus"
)

// adopt takes over the partitions whose inputs a silent owner holds. A
// term starts when the server delivers an input under a new pin, and it
// gives the pin only with a delivery: on a partition with no new input, an
// input delivered to an owner that then died came back only after its ack
// wait (30 s by default), although the next owner was pulling 3 s after the
// death. Every PinnedTTL, adopt lists the partition consumers (one request
// for all) and, for each partition this instance pulls where inputs are
// delivered and unacked while nobody holds the pin (the holder stopped
// pulling for longer than PinnedTTL, so the server unpinned it), applies
// them as a new term does: caught up with the changelog, in stream order.
// Their delivered copies come back after the ack wait and are acked as
// duplicates. Should the silent owner still be working, the changelog's
// fence keeps the two apart, as for any takeover.
//
// Only inputs delivered before this instance began pulling a partition
// can be held by a silent owner (what is delivered to this instance's
// pulls, it holds itself), and those come back by themselves after the ack
// wait: so the consumers are listed only while a partition this instance
// pulls began pulling within the ack wait (adoptDue), not every PinnedTTL
// for the instance's whole life.
func (r *Runner) adopt(ctx context.Context) {
	names := map[string]int{}
	for p := 0; p <= r.partitions; p++ {
		names[bus.ConsumerFor(r.cfg.Consumer, p)] = p
	}
	// adopted is, per partition, the range last taken this way: the
	// consumer shows it unacked until the ack wait ends, and it is not
	// read again meanwhile.
	adopted := map[int][2]uint64{}
	t := time.NewTicker(r.cfg.PinnedTTL)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !adoptDue(r.pullStarts(), time.Now(), r.cfg.AckWait) {
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		orphaned := r.orphaned(lctx, names)
		cancel()
		for p, span := range orphaned {
			if adopted[p] == span {
				continue
			}
			adopted[p] = span
			t0 := time.Now()
			n, err := r.takeOver(ctx, p, span[0], span[1])
			if err != nil {
				r.Log.Warn("cannot take the inputs a silent owner holds; they come back after their ack wait",
					"partition", p, "err", err)
				delete(adopted, p)
				continue
			}
			r.Metrics.Inc("ctxpipe_partitions_adopted_total", "")
			r.Log.Info("partition taken from a silent owner", "partition", p, "ack_floor", span[0],
				"replayed_unacked", n, "took", time.Since(t0).Round(time.Millisecond))
		}
	}
}

// orphaned lists, for the partitions this instance pulls, the unacked
// inputs (ack floor, last delivered) of those nobody holds the pin of.
func (r *Runner) orphaned(ctx context.Context, names map[string]int) map[int][2]uint64 {
	s, err := r.JS.Stream(ctx, bus.StreamIn)
	if err != nil {
		return nil
	}
	out := map[int][2]uint64{}
	list := s.ListConsumers(ctx)
	for info := range list.Info() {
		p, ok := names[info.Name]
		if !ok || info.NumAckPending == 0 || info.Delivered.Stream <= info.AckFloor.Stream {
			continue
		}
		pulling := false
		r.parts[p].set(func(s *partState) { pulling = s.stop != nil })
		if !r.parts[p].want.Load() || !pulling {
			continue
		}
		pinned := false
		for _, g := range info.PriorityGroups {
			pinned = pinned || g.PinnedClientID != ""
		}
		if !pinned {
			out[p] = [2]uint64{info.AckFloor.Stream, info.Delivered.Stream}
		}
	}
	if list.Err() != nil {
		return nil
	}
	return out
}

// pullStarts is, for each partition this instance pulls, when its current
// iterator began pulling.
func (r *Runner) pullStarts() []time.Time {
	var out []time.Time
	for p := range r.parts {
		r.parts[p].set(func(s *partState) {
			if s.stop != nil {
				out = append(out, s.pullSince)
			}
		})
	}
	return out
}

// adoptDue tells whether a silent owner may hold inputs of a partition
// pulled since starts: one of them began pulling within ackWait of now.
// Past it, whatever was delivered before has come back by itself.
func adoptDue(starts []time.Time, now time.Time, ackWait time.Duration) bool {
	for _, t := range starts {
		if now.Sub(t) < ackWait {
			return true
		}
	}
	return false
}
