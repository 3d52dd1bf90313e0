package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
)

// Strays are inputs CTX_IN stored under a subject that no partition's
// consumer delivers (bus.Reached): a tenant-form subject with a token that
// is a literal '>' (or, on a server without nats.conf's mappings, '*'),
// which the partition transform skips. They would sit in the stream, neither
// applied nor rejected.
//
// Every StrayInterval (and at the start) the sweeper lists the stream's
// subjects of the shape strays have (bus.StraySubjects), which holds
// nothing else: in steady state the listing is empty and costs the server
// one walk of its subject index, and no input pays anything. Each stray
// found is read from the stream and goes through the workers like any
// input, where its subject gets it rejected (bad_conversation_id,
// bad_subject or unknown_kind) with an input_rejected event under its
// tenant's _invalid conversation, committed to a partition the instance
// pulls; once that is committed, the stray is deleted from CTX_IN, so the
// next listing no longer holds it. Every instance that pulls a partition
// looks; two finding the same stray commit one rejection (the second is a
// duplicate by id) and delete it once.
//
// Not found this way: a shared-form subject with a '>' token
// (ctx.in.>.turn), which only a client of the service's own account can
// publish, and which only a listing of every shared subject would find.
// nats.conf refuses it to every user; bus.PublishInput refuses it too.

// straySweeper finds the strays and hands each to the workers.
type straySweeper struct {
	js         jetstream.JetStream
	partitions int           // N
	every      time.Duration // Config.StrayInterval
	own        *ownership
	// queue hands a stray, as a fetched input of partition p, to the
	// workers (Runner's hold and push).
	queue   func(j *job)
	logger  *slog.Logger
	metrics *Metrics
}

// run looks for strays at once and then every StrayInterval until ctx is
// done.
func (w *straySweeper) run(ctx context.Context) {
	w.metrics.Help("ctxpipe_inputs_stray_total", "Inputs CTX_IN stored where no partition's consumer reads them (a subject token that is a literal wildcard), found and given to the workers to be rejected.")
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := w.sweep(ctx); err != nil && ctx.Err() == nil {
			w.logger.Warn("looking for stray inputs failed; looking again later", "err", err, "retry_in", w.every)
		}
		t.Reset(w.every)
	}
}

// sweep finds the strays CTX_IN holds now and has each rejected.
func (w *straySweeper) sweep(ctx context.Context) error {
	if w.own.strayPartition() < 0 {
		return nil // this instance pulls no partition now: the others look
	}
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	s, err := w.js.Stream(lctx, bus.StreamIn)
	var info *jetstream.StreamInfo
	if err == nil {
		info, err = s.Info(lctx, jetstream.WithSubjectFilter(bus.StraySubjects))
	}
	cancel()
	if err != nil {
		return fmt.Errorf("list %s under %s: %w", bus.StreamIn, bus.StraySubjects, err)
	}
	filters := map[string]bool{}
	for subj := range info.State.Subjects {
		if !bus.Reached(subj, w.partitions) {
			filters[bus.StrayFilter(subj)] = true
		}
	}
	done := map[uint64]bool{} // two filters may deliver one stray
	for f := range filters {
		if err := w.sweepFilter(ctx, s, f, done); err != nil {
			return err
		}
	}
	return nil
}

// sweepFilter reads what CTX_IN stores under filter (headers only) and has
// each stray among it rejected. The filter may deliver inputs a partition
// reads too (ctx.in.acme.> holds the shared conversation acme's inputs):
// those are left alone.
func (w *straySweeper) sweepFilter(ctx context.Context, s jetstream.Stream, filter string, done map[uint64]bool) error {
	oc, err := w.js.OrderedConsumer(ctx, bus.StreamIn, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{filter},
		HeadersOnly:    true,
		// Gone from the server soon after the last read.
		InactiveThreshold: 5 * time.Second,
	})
	if err != nil {
		return fmt.Errorf("read %s: %w", filter, err)
	}
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	info, err := oc.Info(ictx)
	cancel()
	if err != nil {
		return fmt.Errorf("read %s: %w", filter, err)
	}
	// Exactly what the server counts for the filter comes (bus.StrayFilter
	// makes a filter for which the two agree).
	for left := info.NumPending; left > 0 && ctx.Err() == nil; left-- {
		msg, err := oc.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			return fmt.Errorf("read %s: %w", filter, err)
		}
		md, err := msg.Metadata()
		if err != nil {
			return fmt.Errorf("read %s: %w", filter, err)
		}
		seq := md.Sequence.Stream
		if done[seq] || bus.Reached(msg.Subject(), w.partitions) {
			continue
		}
		done[seq] = true
		if err := w.stray(ctx, s, msg.Subject(), seq); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// stray has the input stored at seq rejected, and then deletes it from the
// stream.
func (w *straySweeper) stray(ctx context.Context, s jetstream.Stream, subject string, seq uint64) error {
	raw, err := s.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil // deleted meanwhile (another instance), or aged out
	}
	if err != nil {
		return fmt.Errorf("stray %s at %d: %w", subject, seq, err)
	}
	w.logger.Warn("an input no partition reads; rejecting it", "subject", subject, "seq", seq)
	w.metrics.Inc("ctxpipe_inputs_stray_total", "")
	m := &strayMsg{raw: raw, done: make(chan bool, 1)}
	// Queued under no conversation, whatever its subject names (a '*' kind
	// leaves a valid one): a worker's batch is one conversation's and is
	// committed to its first input's partition, and a conversation's real
	// inputs must stay in theirs. Its rejection is filed under its
	// tenant's _invalid conversation.
	p := w.own.strayPartition()
	if p < 0 {
		return fmt.Errorf("stray %s at %d: this instance pulls no partition now", subject, seq)
	}
	now := time.Now()
	j := &job{msg: m, partition: p, subject: raw.Subject, seq: seq, deliver: 1,
		touched: now, stored: raw.Time, fetched: now}
	w.queue(j)
	select {
	case committed := <-m.done:
		if !committed {
			return fmt.Errorf("stray %s at %d: given back (stopping)", subject, seq)
		}
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := s.DeleteMsg(ctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		// Found again by the next sweep: its rejection is a duplicate then.
		return fmt.Errorf("delete stray %s at %d: %w", subject, seq, err)
	}
	return nil
}

// strayMsg is a stray as the workers see it: the message as the stream
// stores it (its first delivery), whose acks tell the sweep how its
// rejection ended (true: committed) instead of going to a consumer.
type strayMsg struct {
	raw  *jetstream.RawStreamMsg
	once sync.Once
	done chan bool
}

func (m *strayMsg) end(committed bool) { m.once.Do(func() { m.done <- committed }) }

func (m *strayMsg) Metadata() (*jetstream.MsgMetadata, error) {
	return &jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: m.raw.Sequence}, NumDelivered: 1,
		Stream: bus.StreamIn, Timestamp: m.raw.Time}, nil
}
func (m *strayMsg) Data() []byte                     { return m.raw.Data }
func (m *strayMsg) Headers() nats.Header             { return m.raw.Header }
func (m *strayMsg) Subject() string                  { return m.raw.Subject }
func (m *strayMsg) Reply() string                    { return "" }
func (m *strayMsg) Ack() error                       { m.end(true); return nil }
func (m *strayMsg) DoubleAck(context.Context) error  { m.end(true); return nil }
func (m *strayMsg) Term() error                      { m.end(true); return nil }
func (m *strayMsg) TermWithReason(string) error      { m.end(true); return nil }
func (m *strayMsg) Nak() error                       { m.end(false); return nil }
func (m *strayMsg) NakWithDelay(time.Duration) error { m.end(false); return nil }
func (m *strayMsg) InProgress() error                { return nil }
