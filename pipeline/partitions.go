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
	"github.com/ctxpipe/ctxpipe/changelog"
	"github.com/ctxpipe/ctxpipe/internal/backoff"
	"github.com/ctxpipe/ctxpipe/schema"
)

// PriorityGroup is the pinned priority group of every partition consumer:
// any number of instances pull, the server delivers to one (the pinned
// client) and moves the pin when that one stops pulling for PinnedTTL.
const PriorityGroup = "owner"

// pinHeader is the header the server marks each message with the pin it was
// delivered under; a new value starts a new ownership term.
const pinHeader = "Nats-Pin-Id"

// setup reads the partition count from CTX_IN and the changelog positions
// from the store.
func (r *Runner) setup(ctx context.Context) error {
	var n int
	err := bus.RetryStart(ctx, r.Log, "read "+bus.StreamIn, func(ctx context.Context) error {
		s, err := r.JS.Stream(ctx, bus.StreamIn)
		if err != nil {
			return err
		}
		n = bus.PartitionsOf(s.CachedInfo().Config)
		return nil
	})
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("stream %s has no partition transform (bus.EnsureStreams adds it)", bus.StreamIn)
	}
	r.partitions = n
	r.Stores.SetPartitions(n)
	r.own.init(n)
	r.committers = make([]*committer, r.Stores.Len())
	r.followers = make([]*follower, r.Stores.Len())
	for i, st := range r.Stores.Files() {
		pos, cursor, err := st.LogPositions(ctx)
		if err != nil {
			return err
		}
		mine := func(p int) bool { return r.Stores.FileOf(p) == i }
		// A file's positions of partitions now in another file (the
		// number of files changed) are not its to follow.
		for p := range pos {
			if !mine(p) {
				delete(pos, p)
			}
		}
		log := newLogState(n, pos, cursor)
		log.held = func(p int) bool { return mine(p) && r.own.holds.isHeld(p) }
		f := newFollower(r.JS, r.own.holds, r.Log, log, mine)
		c := &committer{i: i, st: st, log: log, follower: f, clog: r.clog,
			maxBatch: r.cfg.MaxBatch, maxBytes: r.cfg.MaxCommitBytes,
			health: &r.stored, metrics: r.Metrics, logger: r.Log,
			committed: r.committed, handled: r.own.handled}
		if r.Relays != nil {
			c.relay = r.Relays[i]
		}
		r.committers[i], r.followers[i] = c, f
	}
	if err := r.ensureConsumers(ctx); err != nil {
		return err
	}
	// Hold (and pull, once restored) only this instance's share from the
	// start, rather than everything until the first rebalance.
	var live []string
	if r.Members != nil && r.cfg.Name != "" {
		if l, err := r.Members.Live(ctx); err == nil {
			live = l
		}
	}
	r.own.assign(live)
	// Published last: other goroutines read r.committers, and r.own's
	// partitions, once they see N.
	r.own.publish(n)
	r.nParts.Store(int64(n))
	return nil
}

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
		r.sweepStrays(loops)
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
		switch pin := msg.Headers().Get(pinHeader); {
		case pin != term || !owning:
			owning, term = true, pin
			if err := r.startTerm(ctx, p, cons, msg); err != nil {
				return fmt.Errorf("take partition %d: %w", p, err)
			}
		case delivery != lastDelivery+1:
			// While pinned, every delivery of the consumer is to this
			// iterator, numbered one after another. A gap is a delivery
			// lost on the way (a node died mid-flight): it would come
			// back only after its ack wait, behind newer inputs of its
			// conversation. Read what is unacked again, as a new term.
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

// startTerm makes this instance ready to apply partition p's inputs after
// gaining it (or after its iterator was rebuilt): its store catches up with
// the changelog, and the inputs the consumer delivered before (to the old
// owner, or to this instance's old iterator) and not yet acked are read
// from the stream and applied first, in stream order. Without this, they
// would come back only after their ack wait, behind newer inputs of the
// same conversations. Applied ones are dropped as duplicates.
func (r *Runner) startTerm(ctx context.Context, p int, cons jetstream.Consumer, first jetstream.Msg) error {
	t0 := time.Now()
	// Every request is bounded, and the whole takeover too: one lost while
	// the cluster elects a leader would otherwise hold the partition. A
	// failure ends the term start; the partition's loop pulls again and the
	// next input starts it anew.
	ctx, cancel := context.WithTimeout(ctx, takeoverLimit)
	defer cancel()
	ictx, icancel := context.WithTimeout(ctx, takeoverStep)
	info, err := cons.Info(ictx)
	icancel()
	if err != nil {
		return fmt.Errorf("consumer info: %w", err)
	}
	floor, delivered := info.AckFloor.Stream, info.Delivered.Stream
	if md, err := first.Metadata(); err == nil {
		// Everything the consumer delivered up to now, to anyone, and
		// nobody acked. Not only what lies below the first input when that
		// is a first delivery: after a consumer leader change the count
		// of deliveries may not be the old leader's, and an input the dead
		// owner held above it would come back after its ack wait, behind
		// newer turns (seen once, as an orphan tool result). What this
		// iterator holds comes again as duplicates.
		delivered = max(delivered, md.Sequence.Stream)
	}
	gap, err := r.takeOver(ctx, p, floor, delivered)
	if err != nil {
		return err
	}
	r.Metrics.Inc("ctxpipe_partition_terms_total", "")
	r.Log.Info("partition taken", "partition", p, "ack_floor", floor, "replayed_unacked", gap,
		"changelog", r.logOf(p).appliedOf(p), "took", time.Since(t0).Round(time.Millisecond))
	return nil
}

// takeoverLimit bounds a whole takeover: the term's start (the consumer's
// state, catching up with the changelog, reading the unacked inputs again)
// or an adoption. Past it the term start fails.
const takeoverLimit = 10 * time.Second

// takeoverStep bounds each request of a takeover.
const takeoverStep = 2 * time.Second

// takeOver catches the store up with the changelog and applies, in stream
// order, partition p's inputs from floor+1 to delivered: those the
// consumer delivered and nobody acked. It returns how many it read.
func (r *Runner) takeOver(ctx context.Context, p int, floor, delivered uint64) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, takeoverLimit)
	defer cancel()
	ictx, icancel := context.WithTimeout(ctx, takeoverStep)
	st, err := r.JS.Stream(ictx, bus.StreamState)
	icancel()
	if err != nil {
		return 0, fmt.Errorf("changelog info: %w", err)
	}
	// Catching up first saves preparing inputs on a stale view (the fence
	// and the foreign mark would refuse them and they would be prepared
	// again); it is not needed for correctness, so a follower that cannot
	// keep up does not hold the partition back for long. Not longer than
	// half the pinned TTL: no pull goes out meanwhile, and a longer wait
	// lost the pin, started a new term, and waited again, in a loop.
	log, follower := r.logOf(p), r.followers[r.Stores.FileOf(p)]
	wctx, wcancel := context.WithTimeout(ctx, min(5*time.Second, r.cfg.PinnedTTL/2))
	last, err := changelog.LastOf(wctx, st, p)
	cursor := log.safeCursor()
	if err == nil {
		err = log.waitSeen(wctx, p, last)
	}
	if err != nil && ctx.Err() == nil {
		r.Log.Warn("taking the partition before catching up with the changelog", "partition", p,
			"changelog_last", last, "applied", log.appliedOf(p), "err", err)
		if last > log.appliedOf(p) && log.safeCursor() == cursor {
			// The follower moved not at all while the changelog held a
			// record it lacks: stalled (after a node loss, its ordered
			// consumer may be re-creating itself). Started again now, not
			// when its watchdog notices: every commit of the partition is
			// fenced until it has applied that record.
			r.Log.Warn("the changelog follower made no progress; following again", "partition", p, "cursor", cursor)
			follower.retry()
		}
	}
	wcancel()
	if floor >= delivered {
		return 0, nil
	}
	return r.replay(ctx, p, floor+1, delivered)
}

func (r *Runner) dispatch(p int, msg jetstream.Msg) {
	now := time.Now()
	j := &job{msg: msg, partition: p, touched: now, fetched: now}
	if md, err := msg.Metadata(); err == nil {
		j.seq, j.deliver, j.stored = md.Sequence.Stream, md.NumDelivered, md.Timestamp
		if j.deliver > 1 {
			r.Metrics.Inc("ctxpipe_redeliveries_total", "")
		}
	}
	_, j.subject, _ = bus.SplitInputSubject(msg.Subject(), r.partitions)
	if conv, _, err := schema.ParseSubject(j.subject); err == nil || conv != "" {
		j.conv = conv
	}
	r.hold(j)
	r.sched.push(j)
}

// replay dispatches partition p's inputs with stream sequences from..to,
// in stream order, each once (readRange), until ctx ends.
func (r *Runner) replay(ctx context.Context, p int, from, to uint64) (int, error) {
	return readRange(ctx, r.JS, bus.PartitionFilter(p, r.partitions), from, to, r.cfg.PullExpiry,
		func(msg jetstream.Msg) { r.dispatch(p, replayed{msg}) },
		func(next uint64, err error) {
			r.Log.Warn("reading the unacked inputs failed; reading on", "partition", p, "from", next, "to", to, "err", err)
		})
}

// readRange reads CTX_IN's messages on filter with stream sequences
// from..to and hands each to each, in stream order, once. Each try reads
// through a consumer of its own (one pull streams the messages), pulled
// with expiry and a heartbeat every quarter of it (at least 500 ms) as the
// partitions are: a try whose consumer's node is lost fails within two
// missed heartbeats (the library's default heartbeat made that 10 s), and
// one whose consumer cannot be created within takeoverStep fails too. The
// next try reads on from the first message not handed on, until ctx ends;
// failed (if not nil) is told of each failed try.
func readRange(ctx context.Context, js jetstream.JetStream, filter string, from, to uint64, expiry time.Duration,
	each func(jetstream.Msg), failed func(next uint64, err error)) (int, error) {
	n := 0
	for next := from; ; {
		k, at, done, err := readRangeOnce(ctx, js, filter, next, to, expiry, each)
		n, next = n+k, at
		switch {
		case done:
			return n, nil
		case ctx.Err() != nil:
			return n, fmt.Errorf("read unacked inputs from %d: %w", next, err)
		case failed != nil:
			failed(next, err)
		}
		select {
		case <-ctx.Done():
			return n, fmt.Errorf("read unacked inputs from %d: %w", next, err)
		case <-time.After(100 * time.Millisecond): // a try that failed at once is not repeated at once
		}
	}
}

// readRangeOnce is one try of readRange: it returns how many messages it
// handed on, the sequence to read on from, and whether it reached to.
func readRangeOnce(ctx context.Context, js jetstream.JetStream, filter string, from, to uint64, expiry time.Duration,
	each func(jetstream.Msg)) (n int, next uint64, done bool, err error) {
	next = from
	cctx, cancel := context.WithTimeout(ctx, takeoverStep)
	cons, err := js.CreateConsumer(cctx, bus.StreamIn, jetstream.ConsumerConfig{
		FilterSubject: filter,
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:   from,
		AckPolicy:     jetstream.AckNonePolicy,
		MemoryStorage: true,
		Replicas:      1,
		// Gone from the server soon after the last read (the default
		// keeps it 5 minutes).
		InactiveThreshold: 5 * time.Second,
	})
	cancel()
	if err != nil {
		return 0, next, false, fmt.Errorf("read unacked inputs: %w", err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(256), jetstream.PullExpiry(expiry),
		jetstream.PullHeartbeat(max(expiry/4, 500*time.Millisecond)), jetstream.WithMessagesErrOnMissingHeartbeat(true))
	if err != nil {
		return 0, next, false, fmt.Errorf("read unacked inputs: %w", err)
	}
	defer it.Stop()
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return n, next, false, fmt.Errorf("read unacked inputs: %w", err)
		}
		md, err := msg.Metadata()
		if err != nil {
			return n, next, false, fmt.Errorf("read unacked inputs: %w", err)
		}
		if md.Sequence.Stream > to {
			return n, next, true, nil
		}
		each(msg)
		n, next = n+1, md.Sequence.Stream+1
		if md.Sequence.Stream == to || md.NumPending == 0 {
			return n, next, true, nil
		}
	}
}

// replayed is an input read from the stream again rather than delivered by
// the partition's consumer: its acks do nothing (the delivered copy is acked
// when it comes back, as a duplicate).
type replayed struct{ jetstream.Msg }

func (replayed) Ack() error                       { return nil }
func (replayed) DoubleAck(context.Context) error  { return nil }
func (replayed) Nak() error                       { return nil }
func (replayed) NakWithDelay(time.Duration) error { return nil }
func (replayed) InProgress() error                { return nil }
func (replayed) Term() error                      { return nil }
func (replayed) TermWithReason(string) error      { return nil }

// probe asks the server about CTX_IN and CTX_STATE every ProbeInterval. An
// idle partition sends nothing but heartbeats, and a stream without a
// leader stores no new input: without this the runner could not tell an
// idle service from one that cannot work.
func (r *Runner) probe(ctx context.Context) {
	t := time.NewTicker(r.cfg.ProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, r.cfg.ProbeInterval)
		err := r.check(pctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			r.health.probeFailed(err)
		default:
			r.health.fetched(time.Now())
		}
	}
}

func (r *Runner) check(ctx context.Context) error {
	for _, name := range []string{bus.StreamIn, bus.StreamState} {
		s, err := r.JS.Stream(ctx, name)
		if err != nil {
			return fmt.Errorf("stream %s info: %w", name, err)
		}
		if c := s.CachedInfo().Cluster; c != nil && c.Leader == "" {
			return fmt.Errorf("stream %s has no leader", name)
		}
	}
	if n := r.failing.Load(); n > 0 {
		return fmt.Errorf("%d partition consumers are being rebuilt", n)
	}
	return nil
}

// Behind is how many partitions this instance holds whose last changelog
// message it has not handled yet (0 when it holds none, or has caught up
// with all).
func (r *Runner) Behind(ctx context.Context) (int, error) {
	if r.nParts.Load() == 0 {
		return 0, nil
	}
	s, err := r.JS.Stream(ctx, bus.StreamState)
	if err != nil {
		return 0, err
	}
	n := 0
	for p := range r.own.parts {
		if !r.own.holds.isHeld(p) {
			continue
		}
		last, err := changelog.LastOf(ctx, s, p)
		if err != nil {
			return 0, err
		}
		if err := r.logOf(p).waitSeen(doneCtx, p, last); err != nil {
			n++
		}
	}
	return n, nil
}

// doneCtx is a context already done: waitSeen with it only checks.
var doneCtx = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

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
