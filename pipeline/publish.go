package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/store"
)

// A context_managing event is announced on
// ctx.progress.<conv>.context_managing, as core NATS, the moment a condense
// starts, so a UI can show "condensing…" while the summarizer runs. No stream
// captures ctx.progress.>: it is a hint that may be lost and may announce a
// condense that a crash then undoes. The record is ctx.events.<conv>.<type>
// (CTX_EVENTS), where the outbox relay publishes every event SQLite
// committed, context_managing included, each once.
//
// ProgressSubject is the subject a progress event of conversation conv and
// type t goes to: ctx.progress.<conv>.<type> (schema.ProgressSubjectPrefix).
func ProgressSubject(conv string, t schema.EventType) string {
	return schema.ProgressSubjectPrefix + conv + "." + string(t)
}

// DefaultScanLimit bounds how many messages JetStreamPublisher.PublishedAfter
// reads; see there.
const DefaultScanLimit = 10000

// JetStreamPublisher publishes outbox rows to the event stream with the event
// id as Nats-Msg-Id, and reads the stream back for the relay. It implements
// store.Publisher, store.PublishedLister and store.PublishedScanner.
type JetStreamPublisher struct {
	JS jetstream.JetStream
	// Stream is the event stream's name (default bus.StreamEvents). Publish
	// expects it, so the sequences it returns are that stream's.
	Stream string
	// ScanLimit bounds PublishedAfter (default DefaultScanLimit).
	ScanLimit int
}

func (p JetStreamPublisher) stream() string {
	if p.Stream == "" {
		return bus.StreamEvents
	}
	return p.Stream
}

// Publish sends one event, waits for the stream's ack and returns the
// event's stream sequence (the original's, when the stream dropped it as a
// duplicate).
func (p JetStreamPublisher) Publish(ctx context.Context, subject string, data []byte, msgID string) (uint64, error) {
	ack, err := p.JS.Publish(ctx, subject, data, jetstream.WithMsgID(msgID), jetstream.WithExpectStream(p.stream()))
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeMsgIDInProcess {
		// Another instance's relay is publishing this very event (both
		// hold it: the writer, and a follower that applied its record).
		// The stream stores one copy; this one is done, its sequence
		// unknown.
		return 0, nil
	}
	if errors.Is(err, nats.ErrMaxPayload) || (errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeMsgTooLarge) {
		return 0, fmt.Errorf("%w: %w", store.ErrUnpublishable, err)
	}
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// errCodeMsgTooLarge is JetStream's "message size exceeds maximum allowed"
// (the stream's max_msg_size).
const errCodeMsgTooLarge jetstream.ErrorCode = 10054

// errCodeMsgIDInProcess is JetStream's "duplicate message id is in process"
// (409): a publish with the same Nats-Msg-Id is being stored right now.
const errCodeMsgIDInProcess jetstream.ErrorCode = 10158

// PublishedAfter returns the Nats-Msg-Id and sequence of the event stream's
// messages after seq, up to the last sequence the stream had when it began.
// It reads headers only, through an ephemeral consumer that it deletes, and
// at most ScanLimit messages: the newest ones, where a relay's unmarked
// events are (at most a batch and its retries, unless something else
// publishes to ctx.events.> in the meantime).
func (p JetStreamPublisher) PublishedAfter(ctx context.Context, seq uint64) ([]store.PublishedMsg, uint64, error) {
	name := p.stream()
	st, err := p.JS.Stream(ctx, name)
	if err != nil {
		return nil, 0, fmt.Errorf("stream %s: %w", name, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil, 0, fmt.Errorf("stream %s: %w", name, err)
	}
	last := info.State.LastSeq
	if last <= seq || info.State.Msgs == 0 {
		return nil, last, nil
	}
	limit := uint64(p.ScanLimit)
	if limit == 0 {
		limit = DefaultScanLimit
	}
	start := max(seq+1, info.State.FirstSeq)
	if last-start+1 > limit {
		start = last - limit + 1
	}
	out, err := readIDs(ctx, st, jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: start}, last)
	if err != nil {
		return nil, 0, fmt.Errorf("stream %s: read after seq %d: %w", name, seq, err)
	}
	return out, last, ctx.Err()
}

// PublishedSince returns the Nats-Msg-Id and sequence of the event stream's
// messages stored at or after t, up to the last sequence the stream had
// when it began, however many: the relay asks for a few seconds' worth, to
// find the events of other writers' records that their relays published.
func (p JetStreamPublisher) PublishedSince(ctx context.Context, t time.Time) ([]store.PublishedMsg, error) {
	name := p.stream()
	st, err := p.JS.Stream(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", name, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", name, err)
	}
	if info.State.Msgs == 0 {
		return nil, nil
	}
	out, err := readIDs(ctx, st, jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &t},
		info.State.LastSeq)
	if err != nil {
		return nil, fmt.Errorf("stream %s: read since %s: %w", name, t.Format(time.RFC3339Nano), err)
	}
	return out, ctx.Err()
}

// readIDs reads the Nats-Msg-Id and sequence of st's messages from where cfg
// starts up to sequence last, headers only, through an ephemeral consumer
// that it deletes.
func readIDs(ctx context.Context, st jetstream.Stream, cfg jetstream.ConsumerConfig, last uint64) ([]store.PublishedMsg, error) {
	cfg.Description = "ctxpipe outbox relay: which events are already in the stream"
	cfg.AckPolicy, cfg.HeadersOnly, cfg.MemoryStorage = jetstream.AckNonePolicy, true, true
	cfg.InactiveThreshold = time.Minute // the server's cleanup if the delete below is lost
	cons, err := st.CreateConsumer(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("read consumer: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = st.DeleteConsumer(dctx, cons.CachedInfo().Name) // best effort: InactiveThreshold is the fallback
	}()
	var out []store.PublishedMsg
	// Ask for no more than remain, or the fetch waits out its MaxWait for
	// messages that will never come. What the consumer had pending when it
	// was made is the messages up to last at least.
	remain := cons.CachedInfo().NumPending
	for {
		if remain == 0 {
			return out, nil
		}
		batch, err := cons.Fetch(int(min(remain, 512)), jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return nil, err
		}
		n := 0
		done := false
		for m := range batch.Messages() {
			n++
			md, err := m.Metadata()
			if err != nil {
				return nil, err
			}
			s := md.Sequence.Stream
			remain = md.NumPending
			if s > last {
				done = true
				continue
			}
			out = append(out, store.PublishedMsg{MsgID: m.Headers().Get(nats.MsgIdHdr), Seq: s})
			if s == last {
				done = true
			}
		}
		if err := batch.Error(); err != nil {
			return nil, err
		}
		// No message in a whole wait: the rest was removed by the stream's
		// limits while we read.
		if done || n == 0 || ctx.Err() != nil {
			return out, nil
		}
	}
}

// ProgressPublisher returns an Engine.Progress func that publishes the
// context_managing event as soon as a condense starts, while the summarizer
// runs, as core NATS on ProgressSubject(conv, type) (ctx.progress.<conv>.
// context_managing). It is never published to ctx.events.>: CTX_EVENTS
// holds only what SQLite committed, and the outbox relay publishes the same
// event there once the batch commits, so ctx.events subscribers see it once.
// A failed progress publish is only logged (log may be nil). js is used for
// its connection.
func ProgressPublisher(js jetstream.JetStream, log *slog.Logger) func(context.Context, schema.Event) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	nc := js.Conn()
	return func(ctx context.Context, ev schema.Event) {
		h := ev.Header()
		data, err := schema.Marshal(ev)
		if err == nil {
			err = nc.Publish(ProgressSubject(h.ConversationID, h.Type), data)
		}
		if err != nil {
			log.Warn("progress event not published; the event stream will still carry it after the commit", "event", h.ID, "err", err)
		}
	}
}
