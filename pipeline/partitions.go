package pipeline

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/internal/backoff"
)

// PriorityGroup is the pinned priority group of every partition consumer:
// any number of instances pull, the server delivers to one (the pinned
// client) and moves the pin when that one stops pulling for PinnedTTL.
const PriorityGroup = "owner"

// pinHeader is the header the server marks each message with the pin it was
// delivered under; a new value starts a new ownership term.
const pinHeader = "Nats-Pin-Id"

// ensureConsumers creates (or updates) every partition's consumer before
// any is pulled: on a fresh cluster each is a replicated group that must
// elect a leader, and pulls sent meanwhile would fail in a burst of
// warnings. A few at a time, each step retried like the other start steps.
func (r *Runner) ensureConsumers(ctx context.Context) error {
	sem := make(chan struct{}, 8)
	errs := make(chan error, r.partitions+1)
	var wg sync.WaitGroup
	for p := 0; p <= r.partitions; p++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			errs <- bus.RetryStart(ctx, r.Log, fmt.Sprintf("create the consumer of partition %d", p), func(ctx context.Context) error {
				cons, err := r.JS.CreateOrUpdateConsumer(ctx, bus.StreamIn, r.ConsumerConfig(p))
				if err == nil {
					r.own.parts[p].set(func(s *partState) { s.cons = cons })
				}
				return err
			})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Partitions is N (0 until Run has read it from CTX_IN).
func (r *Runner) Partitions() int { return int(r.nParts.Load()) }

// ConsumerConfig is partition p's durable consumer. Every instance creates
// it alike; its replicas follow the stream's, so its position and pin
// survive a node loss.
func (r *Runner) ConsumerConfig(p int) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:   bus.ConsumerFor(r.cfg.Consumer, p),
		AckPolicy: jetstream.AckExplicitPolicy,
		AckWait:   r.cfg.AckWait,
		// The service rejects an input as poison at its MaxDeliver-th
		// delivery; the server itself never stops delivering it. Were the
		// server to stop there too, an input whose poison record did not
		// commit (the service died, or lost its connection, at that
		// delivery) would never come back: lost without a record.
		MaxDeliver:     -1,
		MaxAckPending:  r.cfg.LaneBuffer * 4,
		FilterSubject:  bus.PartitionFilter(p, r.partitions),
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		PriorityGroups: []string{PriorityGroup},
		PriorityPolicy: jetstream.PriorityPolicyPinned,
		PinnedTTL:      r.cfg.PinnedTTL,
	}
}

// consume runs one loop per partition until ctx is done. It returns an error
// only when the connection was closed.
func (r *Runner) consume(ctx context.Context) error {
	var wg sync.WaitGroup
	errs := make(chan error, r.partitions+1)
	loops, stop := context.WithCancel(ctx)
	defer stop()
	for p := 0; p <= r.partitions; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.partitionLoop(loops, p); err != nil {
				errs <- err
				stop()
			}
		}()
	}
	swept := make(chan struct{})
	go func() {
		defer close(swept)
		sweeper := &straySweeper{js: r.JS, partitions: r.partitions, every: r.cfg.StrayInterval, own: r.own,
			queue: func(j *job) {
				r.held.hold(j)
				r.sched.push(j)
			},
			logger: r.Log, metrics: r.Metrics}
		sweeper.run(loops)
	}()
	probeCtx, stopProbe := context.WithCancel(ctx)
	defer stopProbe()
	go r.probe(probeCtx)
	go r.own.rebalance(probeCtx)
	go (&adopter{js: r.JS, consumer: r.cfg.Consumer, partitions: r.partitions, pinnedTTL: r.cfg.PinnedTTL, ackWait: r.cfg.AckWait,
		own: r.own, takeOver: r.takeOver, logger: r.Log, metrics: r.Metrics}).run(probeCtx)
	r.health.up()
	r.Log.Info("consuming", "stream", bus.StreamIn, "partitions", r.partitions, "workers", r.cfg.Lanes)
	wg.Wait()
	// The sweep dispatches too: it ends before the workers are told to.
	stop()
	<-swept
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// partitionLoop pulls partition p's consumer, rebuilding the iterator (and
// the consumer, if it is gone) after any failure, with backoff.
func (r *Runner) partitionLoop(ctx context.Context, p int) error {
	retry := backoff.New(backoff.Policy{First: 250 * time.Millisecond, Max: 2 * time.Second, Jitter: true})
	var failedAt time.Time
	failures := 0
	for ctx.Err() == nil {
		if !r.own.parts[p].waitWanted(ctx) {
			break
		}
		err := r.consumePartition(ctx, p, func() {
			if failures > 0 {
				r.failing.Add(-1)
				r.Log.Info("consuming again", "partition", p, "failures", failures, "down_for", time.Since(failedAt).Round(time.Millisecond))
				failures = 0
			}
			retry.Reset()
		})
		if ctx.Err() != nil {
			break
		}
		yielded := false
		r.own.parts[p].set(func(s *partState) { yielded = s.yielding })
		if yielded {
			r.handOver(ctx, p)
			continue
		}
		if !r.own.parts[p].want.Load() {
			continue // stopped as a standby that should not pull
		}
		if errors.Is(err, nats.ErrConnectionClosed) {
			return fmt.Errorf("consume partition %d: %w", p, err)
		}
		if failures == 0 {
			failedAt = time.Now()
			r.failing.Add(1)
		}
		failures++
		r.health.probeFailed(err)
		r.Metrics.Inc("ctxpipe_consumer_rebuilds_total", "")
		wait := retry.Next()
		r.Log.Warn("partition consumer failed; rebuilding it", "partition", p, "err", err, "attempt", failures, "retry_in", wait)
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
	if failures > 0 {
		r.failing.Add(-1)
	}
	return nil
}

// consumePartition creates (or finds) partition p's consumer and pulls from
// it until ctx is done (nil) or the iterator fails (the error).
func (r *Runner) consumePartition(ctx context.Context, p int, up func()) error {
	// The handle ensureConsumers made serves the first pull; after any
	// failure the consumer is created again (it may be gone).
	var cons jetstream.Consumer
	r.own.parts[p].set(func(s *partState) { cons, s.cons = s.cons, nil })
	if cons == nil {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		var err error
		cons, err = r.JS.CreateOrUpdateConsumer(cctx, bus.StreamIn, r.ConsumerConfig(p))
		cancel()
		if err != nil {
			return fmt.Errorf("consumer of partition %d: %w", p, err)
		}
	}
	it, err := cons.Messages(
		jetstream.PullMaxMessages(max(r.cfg.LaneBuffer/2, 16)),
		// Short pulls with frequent heartbeats: a lost consumer leader is
		// noticed in two heartbeats, and the pin is renewed by every pull,
		// well within PinnedTTL.
		jetstream.PullExpiry(r.cfg.PullExpiry),
		jetstream.PullHeartbeat(max(r.cfg.PullExpiry/4, 500*time.Millisecond)),
		jetstream.PullPriorityGroup(PriorityGroup),
	)
	if err != nil {
		return fmt.Errorf("pull partition %d: %w", p, err)
	}
	defer it.Stop()
	stopDrain := context.AfterFunc(ctx, it.Drain)
	defer stopDrain()
	r.own.parts[p].set(func(s *partState) { s.stop, s.pullSince = it.Stop, time.Now() })
	up()
	// term is the pin this iterator's messages came under; "" before the
	// first. A message under another pin starts a new term: this instance
	// (re)gained the partition and must first catch up.
	term, owning := "", false
	var lastDelivery uint64 // the consumer sequence of the last delivery this term
	defer r.own.parts[p].set(func(s *partState) { s.owning, s.stop = false, nil })
	for {
		msg, err := it.Next()
		if err != nil {
			if ctx.Err() != nil && errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			return fmt.Errorf("fetch partition %d: %w", p, err)
		}
		now := time.Now()
		r.health.fetched(now)
		var delivery uint64
		if md, err := msg.Metadata(); err == nil {
			delivery = md.Sequence.Consumer
		}
		pin := msg.Headers().Get(pinHeader)
		switch termOf(owning, term, pin, lastDelivery, delivery) {
		case termStarts:
			owning, term = true, pin
			if err := r.startTerm(ctx, p, cons, msg); err != nil {
				return fmt.Errorf("take partition %d: %w", p, err)
			}
		case termResyncs:
			r.Log.Warn("deliveries lost in transit; replaying the unacked inputs", "partition", p,
				"expected", lastDelivery+1, "got", delivery)
			if err := r.startTerm(ctx, p, cons, msg); err != nil {
				return fmt.Errorf("resync partition %d: %w", p, err)
			}
		}
		lastDelivery = delivery
		r.own.parts[p].set(func(s *partState) { s.owning, s.lastInput = true, now })
		r.dispatch(p, msg)
	}
}

// termStep is what a delivery means for the term of the iterator that
// received it.
type termStep uint8

const (
	// termGoesOn: the next delivery of the term.
	termGoesOn termStep = iota
	// termStarts: the iterator's first delivery, or one under another pin:
	// this instance (re)gained the partition and must first catch up.
	termStarts
	// termResyncs: while pinned, every delivery of the consumer is to this
	// iterator, numbered one after another. A gap is a delivery lost on
	// the way (a node died mid-flight): it would come back only after its
	// ack wait, behind newer inputs of its conversation. What is unacked
	// is read again, as for a new term.
	termResyncs
)

// termOf decides what a delivery under pin, numbered delivery by the
// consumer, means for an iterator whose term so far (owning: it received
// one) came under term, last numbered last.
func termOf(owning bool, term, pin string, last, delivery uint64) termStep {
	switch {
	case pin != term || !owning:
		return termStarts
	case delivery != last+1:
		return termResyncs
	}
	return termGoesOn
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
	r.own.parts[p].set(func(s *partState) { s.yielding = false })
}
