package pipeline

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/changelog"
)

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
	r.replays.reset(p)
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
			r.Log.Warn("the changelog follower made no progress; following again",
				append([]any{"partition", p, "cursor", cursor}, follower.progress()...)...)
			follower.retry()
		}
	}
	wcancel()
	if floor >= delivered {
		return 0, nil
	}
	return r.replay(ctx, p, floor+1, delivered)
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
		// A consumer may send its heartbeats and no message, short of the
		// read's end, for as long as the read lasts. After stallAfter
		// without one the leader is asked: if the stream holds more, the
		// try fails and the next makes a new consumer; if not, the read
		// is complete.
		nctx, cancel := context.WithTimeout(ctx, stallAfter)
		msg, err := it.Next(jetstream.NextContext(nctx))
		cancel()
		if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			more, herr := holdsBetween(ctx, js, filter, next, to)
			switch {
			case herr != nil:
				return n, next, false, fmt.Errorf("read unacked inputs: %w", herr)
			case !more:
				return n, next, true, nil
			}
			return n, next, false, fmt.Errorf("read unacked inputs: %w: nothing for %v from %d, the stream holds more up to %d",
				errStalled, stallAfter, next, to)
		}
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
		if md.Sequence.Stream == to {
			return n, next, true, nil
		}
		if md.NumPending == 0 {
			// A consumer made on a replica still catching up with the
			// stream (after a node loss) says nothing is pending early,
			// and delivers the rest only as its replica gets it. to need
			// not be a message on filter (a filtered consumer's delivered
			// sequence can lie past its last message), so whether the
			// read is complete is asked of the stream's leader.
			more, err := holdsBetween(ctx, js, filter, next, to)
			if err != nil {
				return n, next, false, fmt.Errorf("read unacked inputs: %w", err)
			}
			if !more {
				return n, next, true, nil
			}
		}
	}
}

// stallAfter is how long a try of a read of unacked inputs waits for its
// consumer's next message before asking whether more is to come: longer
// than a pull's expiry, so that a consumer that is only slow (a replica
// catching up) is not given up.
const stallAfter = 3 * time.Second

// errStalled fails a try whose consumer delivered nothing for stallAfter
// while the stream held more of the read.
var errStalled = errors.New("the consumer delivers nothing")

// holdsBetween says whether CTX_IN holds a message on filter with a stream
// sequence from..to. It asks the stream's leader (CTX_IN allows no direct
// gets, so no replica answers) for the first such message from from on,
// and, when there is none, how far its store goes: a leader just elected
// may answer before it has applied everything its log holds.
func holdsBetween(ctx context.Context, js jetstream.JetStream, filter string, from, to uint64) (bool, error) {
	if from > to {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, takeoverStep)
	defer cancel()
	s, err := js.Stream(ctx, bus.StreamIn)
	if err != nil {
		return false, fmt.Errorf("inputs stream: %w", err)
	}
	var first, last uint64
	m, err := s.GetMsg(ctx, from, jetstream.WithGetMsgSubject(filter))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		info, err := s.Info(ctx)
		if err != nil {
			return false, fmt.Errorf("inputs stream: %w", err)
		}
		last = info.State.LastSeq
	case err != nil:
		return false, fmt.Errorf("first input on %s from %d: %w", filter, from, err)
	default:
		first = m.Sequence
	}
	return holdsUpTo(first, last, to)
}

// holdsUpTo decides holdsBetween from the leader's answers: first, the
// sequence of the first message on the filter from the read's next one (0:
// none), and last, when there is none, the last sequence its store holds.
// A message past to proves the store holds everything up to to; none proves
// nothing unless the store reaches to, which the stream held when its
// consumer delivered it.
func holdsUpTo(first, last, to uint64) (bool, error) {
	switch {
	case first != 0:
		return first <= to, nil
	case last >= to:
		return false, nil
	}
	return false, fmt.Errorf("the stream's leader holds messages up to %d, short of %d: not caught up yet", last, to)
}

// replayed is an input read from the stream again rather than delivered by
// the partition's consumer: its acks do nothing (the delivered copy is acked
// when it comes back: replays).
type replayed struct{ jetstream.Msg }

func (replayed) Ack() error                       { return nil }
func (replayed) DoubleAck(context.Context) error  { return nil }
func (replayed) Nak() error                       { return nil }
func (replayed) NakWithDelay(time.Duration) error { return nil }
func (replayed) InProgress() error                { return nil }
func (replayed) Term() error                      { return nil }
func (replayed) TermWithReason(string) error      { return nil }
