package pipeline

import (
	"context"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
)

// An adopter takes over the partitions whose inputs a silent owner holds. A
// term starts when the server delivers an input under a new pin, and it
// gives the pin only with a delivery: on a partition with no new input, an
// input delivered to an owner that then died came back only after its ack
// wait (30 s by default), although the next owner was pulling 3 s after the
// death. Every PinnedTTL, it lists the partition consumers (one request
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
type adopter struct {
	js         jetstream.JetStream
	consumer   string // Config.Consumer: the partition consumers' name
	partitions int    // N
	// pinnedTTL and ackWait are Config's.
	pinnedTTL, ackWait time.Duration
	own                *ownership
	// takeOver applies partition p's inputs from floor+1 to delivered
	// after catching up with the changelog (Runner.takeOver).
	takeOver func(ctx context.Context, p int, floor, delivered uint64) (int, error)
	logger   *slog.Logger
	metrics  *Metrics
}

// run adopts every pinnedTTL until ctx ends.
func (a *adopter) run(ctx context.Context) {
	names := map[string]int{}
	for p := 0; p <= a.partitions; p++ {
		names[bus.ConsumerFor(a.consumer, p)] = p
	}
	// adopted is, per partition, the range last taken this way: the
	// consumer shows it unacked until the ack wait ends, and it is not
	// read again meanwhile.
	adopted := map[int][2]uint64{}
	t := time.NewTicker(a.pinnedTTL)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !adoptDue(a.own.pullStarts(), time.Now(), a.ackWait) {
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		orphaned := a.orphaned(lctx, names)
		cancel()
		for p, span := range orphaned {
			if adopted[p] == span {
				continue
			}
			adopted[p] = span
			t0 := time.Now()
			n, err := a.takeOver(ctx, p, span[0], span[1])
			if err != nil {
				a.logger.Warn("cannot take the inputs a silent owner holds; they come back after their ack wait",
					"partition", p, "err", err)
				delete(adopted, p)
				continue
			}
			a.metrics.Inc("ctxpipe_partitions_adopted_total", "")
			a.logger.Info("partition taken from a silent owner", "partition", p, "ack_floor", span[0],
				"replayed_unacked", n, "took", time.Since(t0).Round(time.Millisecond))
		}
	}
}

// orphaned lists, for the partitions this instance pulls, the unacked
// inputs (ack floor, last delivered) of those nobody holds the pin of.
func (a *adopter) orphaned(ctx context.Context, names map[string]int) map[int][2]uint64 {
	s, err := a.js.Stream(ctx, bus.StreamIn)
	if err != nil {
		return nil
	}
	out := map[int][2]uint64{}
	list := s.ListConsumers(ctx)
	for info := range list.Info() {
		p, ok := names[info.Name]
		if !ok {
			continue
		}
		pulling := false
		a.own.parts[p].set(func(s *partState) { pulling = s.stop != nil })
		if span, ok := orphanedSpan(info, pulling && a.own.parts[p].want.Load()); ok {
			out[p] = span
		}
	}
	if list.Err() != nil {
		return nil
	}
	return out
}

// orphanedSpan is the unacked inputs (ack floor, last delivered) of a
// partition consumer when a silent owner holds them: inputs are delivered
// and unacked, and nobody holds the pin. pulling says this instance pulls
// the partition: only then are they its to adopt.
func orphanedSpan(info *jetstream.ConsumerInfo, pulling bool) ([2]uint64, bool) {
	if !pulling || info.NumAckPending == 0 || info.Delivered.Stream <= info.AckFloor.Stream {
		return [2]uint64{}, false
	}
	for _, g := range info.PriorityGroups {
		if g.PinnedClientID != "" {
			return [2]uint64{}, false
		}
	}
	return [2]uint64{info.AckFloor.Stream, info.Delivered.Stream}, true
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
