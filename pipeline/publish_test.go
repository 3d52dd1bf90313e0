package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/internal/natstest"
	"github.com/ctxpipe/ctxpipe/pipeline"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/store"
)

// dupWindow is the test stream's duplicate window: short, so a test can
// outlast it.
const dupWindow = time.Second

// eventsStream starts a server with CTX_EVENTS as configured in production,
// but for its duplicate window.
func eventsStream(t *testing.T) (*nats.Conn, jetstream.JetStream, jetstream.Stream) {
	t.Helper()
	_, url := natstest.Run(t)
	nc := natstest.Connect(t, url)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := bus.EventsStreamConfig()
	cfg.Duplicates = dupWindow
	st, err := js.CreateStream(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js, st
}

// commitEvents commits n turns, each with one event, and returns the event
// ids in commit order.
func commitEvents(t *testing.T, s *store.Store, n int) []string {
	t.Helper()
	var ids []string
	for i := range n {
		conv := fmt.Sprintf("conv-%d", i%3)
		in := uuid.NewString()
		ev := &schema.CondenseFailed{EventHeader: schema.EventHeader{ID: uuid.NewString(), Type: schema.EventCondenseFailed,
			ConversationID: conv, TS: int64(i), InputID: in}, Error: schema.ReasonLLMError}
		e := store.Entry{
			Input: store.InputRecord{ID: in, ConversationID: conv, Kind: "turn", Subject: schema.InputSubject(conv, schema.KindTurn),
				TS: int64(i), Payload: []byte(`{}`), Status: store.StatusApplied},
			Changes: &schema.Changes{Events: []schema.Event{ev}},
		}
		if _, err := s.Commit(context.Background(), []store.Entry{e}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, ev.ID)
	}
	return ids
}

// streamIDs is the Nats-Msg-Id of every message in the stream, in order.
func streamIDs(t *testing.T, st jetstream.Stream) []string {
	t.Helper()
	ctx := context.Background()
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("GetMsg(%d): %v", seq, err)
		}
		out = append(out, m.Header.Get(nats.MsgIdHdr))
	}
	return out
}

// runRelay runs r until the returned stop is called; stop returns Run's error.
func runRelay(r *store.Relay) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	var err error
	return func() error {
		once.Do(func() { cancel(); err = <-done })
		return err
	}
}

func flushRelay(t *testing.T, r *store.Relay) {
	t.Helper()
	// The deadline only bounds a broken relay.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.Flush(ctx); err != nil {
		t.Fatalf("Flush: %v", err)
	}
}

func exactlyOnce(t *testing.T, got, want []string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("CTX_EVENTS holds %d events, want %d (each once)", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("CTX_EVENTS event %d is %s, want %s", i, got[i], want[i])
		}
	}
}

// crashingPublisher publishes for real; after its crashAt-th publish it
// closes the store, so the relay dies between the ack and the mark, as a
// SIGKILL there would leave things.
type crashingPublisher struct {
	pipeline.JetStreamPublisher
	s       *store.Store
	crashAt int
	calls   int
}

func (p *crashingPublisher) Publish(ctx context.Context, subject string, data []byte, msgID string) (uint64, error) {
	seq, err := p.JetStreamPublisher.Publish(ctx, subject, data, msgID)
	if p.calls++; p.calls == p.crashAt {
		p.s.Close()
	}
	return seq, err
}

// lossyPublisher publishes for real but reports a failure until a deadline,
// as when the acks of a stream under an outage do not come back.
type lossyPublisher struct {
	pipeline.JetStreamPublisher
	until time.Time
}

func (p lossyPublisher) Publish(ctx context.Context, subject string, data []byte, msgID string) (uint64, error) {
	seq, err := p.JetStreamPublisher.Publish(ctx, subject, data, msgID)
	if err == nil && time.Now().Before(p.until) {
		return 0, errors.New("ack lost")
	}
	return seq, err
}

// Item 11: a crash after the publish ack and before the mark, then a restart
// after the duplicate window: the relay finds the events in CTX_EVENTS and
// does not send them again.
func TestRelayCrashAfterAckRestartAfterWindow(t *testing.T) {
	tests := []struct {
		name      string
		before    int // events published and marked before the crash
		crashAt   int // the crashing relay's publish after which it dies
		after     int // events committed before the crash
		restartIn time.Duration
	}{
		{"first batch ever unmarked, no cursor yet", 0, 5, 20, 2 * dupWindow},
		{"mid-stream, second batch half unmarked", 10, 12, 20, 2 * dupWindow},
		{"restart within the window", 10, 12, 20, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			_, js, st := eventsStream(t)
			path := filepath.Join(t.TempDir(), "ctx.db")
			s, err := store.Open(ctx, path)
			if err != nil {
				t.Fatal(err)
			}
			pub := pipeline.JetStreamPublisher{JS: js}
			opts := store.RelayOptions{BatchSize: 8, PollInterval: 10 * time.Millisecond, MinBackoff: time.Millisecond,
				MaxBackoff: 10 * time.Millisecond, DuplicateWindow: dupWindow}
			want := commitEvents(t, s, tc.before)
			if tc.before > 0 {
				r := store.NewRelay(s, pub, nil, opts)
				stop := runRelay(r)
				flushRelay(t, r)
				if err := stop(); err != nil {
					t.Fatal(err)
				}
			}
			want = append(want, commitEvents(t, s, tc.after)...)
			crash := store.NewRelay(s, &crashingPublisher{JetStreamPublisher: pub, s: s, crashAt: tc.crashAt}, nil, opts)
			if err := crash.Run(ctx); !errors.Is(err, store.ErrClosed) {
				t.Fatalf("crashing relay Run = %v, want ErrClosed", err)
			}
			time.Sleep(tc.restartIn)

			s, err = store.Open(ctx, path)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			r := store.NewRelay(s, pub, nil, opts)
			stop := runRelay(r)
			defer stop()
			flushRelay(t, r)
			exactlyOnce(t, streamIDs(t, st), want)
		})
	}
}

// Item 11: acks lost for longer than the duplicate window while the relay
// keeps retrying: each event still reaches CTX_EVENTS once.
func TestRelayAcksLostLongerThanWindow(t *testing.T) {
	ctx := context.Background()
	_, js, st := eventsStream(t)
	s, err := store.Open(ctx, filepath.Join(t.TempDir(), "ctx.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	want := commitEvents(t, s, 4)
	pub := lossyPublisher{JetStreamPublisher: pipeline.JetStreamPublisher{JS: js}, until: time.Now().Add(3 * dupWindow)}
	r := store.NewRelay(s, pub, nil, store.RelayOptions{PollInterval: 10 * time.Millisecond,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, DuplicateWindow: dupWindow})
	stop := runRelay(r)
	defer stop()
	time.Sleep(time.Until(pub.until))
	flushRelay(t, r)
	exactlyOnce(t, streamIDs(t, st), want)
}

// Item 11: progress goes to ctx.progress.<conv>.context_managing as core
// NATS and never to ctx.events.>, so CTX_EVENTS holds only committed events
// and live ctx.events subscribers get each event once, from the relay.
func TestProgressIsNotAnEvent(t *testing.T) {
	nc, js, st := eventsStream(t)
	events, err := nc.SubscribeSync(bus.EventSubjects)
	if err != nil {
		t.Fatal(err)
	}
	progress, err := nc.SubscribeSync(schema.ProgressSubjectPrefix + ">")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	ev := &schema.ContextManaging{EventHeader: schema.EventHeader{ID: uuid.NewString(), Type: schema.EventContextManaging,
		ConversationID: "conv-1", TS: 1, InputID: uuid.NewString()}, Trigger: schema.TriggerAuto}
	pipeline.ProgressPublisher(js, nil)(context.Background(), ev)

	m, err := progress.NextMsg(10 * time.Second) // bounds a broken publish only
	if err != nil {
		t.Fatalf("no progress message: %v", err)
	}
	if want := "ctx.progress.conv-1.context_managing"; m.Subject != want || pipeline.ProgressSubject("conv-1", schema.EventContextManaging) != want {
		t.Fatalf("progress subject %q, want %q", m.Subject, want)
	}
	if got, err := schema.DecodeEvent(m.Data); err != nil || got.Header().ID != ev.ID {
		t.Fatalf("progress payload: %v, %v", got, err)
	}
	// Anything published to ctx.events would have reached events before
	// the progress message (one connection keeps order).
	if m, err := events.NextMsg(100 * time.Millisecond); err == nil {
		t.Fatalf("progress also published on %s", m.Subject)
	}
	if ids := streamIDs(t, st); len(ids) != 0 {
		t.Fatalf("CTX_EVENTS holds %d messages, want none", len(ids))
	}
}

// BenchmarkPublishedAfter times the relay's look at CTX_EVENTS at its widest:
// DefaultScanLimit messages of 1 KiB, headers only.
func BenchmarkPublishedAfter(b *testing.B) {
	_, url := natstest.Run(b)
	js, err := jetstream.New(natstest.Connect(b, url))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, bus.EventsStreamConfig()); err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 1024)
	for i := range pipeline.DefaultScanLimit {
		if _, err := js.PublishAsync(fmt.Sprintf("ctx.events.c%d.condense_failed", i%10), data, jetstream.WithMsgID(uuid.NewString())); err != nil {
			b.Fatal(err)
		}
	}
	<-js.PublishAsyncComplete()
	pub := pipeline.JetStreamPublisher{JS: js}
	for b.Loop() {
		msgs, last, err := pub.PublishedAfter(ctx, 0)
		if err != nil || len(msgs) != pipeline.DefaultScanLimit || last != uint64(pipeline.DefaultScanLimit) {
			b.Fatalf("PublishedAfter = %d msgs, last %d, %v", len(msgs), last, err)
		}
	}
}

// An event too large to publish (over the server's max_payload) holds back
// no later row: it is logged, skipped and counted, the rows after it go out,
// and it stays in the events table.
func TestRelaySkipsAnEventTooLargeToPublish(t *testing.T) {
	ctx := context.Background()
	_, js, st := eventsStream(t)
	s, err := store.Open(ctx, filepath.Join(t.TempDir(), "ctx.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	before := commitEvents(t, s, 2)
	// A summary of 9 MiB: larger than the test server's max_payload.
	in := uuid.NewString()
	huge := &schema.CondenseContext{EventHeader: schema.EventHeader{ID: uuid.NewString(), Type: schema.EventCondenseContext,
		ConversationID: "big", TS: 10, InputID: in}, Summary: strings.Repeat("s", 9<<20), Trigger: schema.TriggerManual}
	if _, err := s.Commit(ctx, []store.Entry{{
		Input: store.InputRecord{ID: in, ConversationID: "big", Kind: "condense", Subject: schema.InputSubject("big", schema.KindCondense),
			TS: 10, Payload: []byte(`{}`), Status: store.StatusApplied},
		Changes: &schema.Changes{Events: []schema.Event{huge}},
	}}); err != nil {
		t.Fatal(err)
	}
	after := commitEvents(t, s, 3)
	r := store.NewRelay(s, pipeline.JetStreamPublisher{JS: js}, nil, store.RelayOptions{BatchSize: 8,
		PollInterval: 10 * time.Millisecond, MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond, DuplicateWindow: dupWindow})
	stop := runRelay(r)
	defer stop()
	flushRelay(t, r)
	exactlyOnce(t, streamIDs(t, st), append(before, after...))
	if r.Skipped() != 1 {
		t.Fatalf("skipped %d events, want 1", r.Skipped())
	}
	evs, err := s.Events(ctx, "big")
	if err != nil || len(evs) != 1 || evs[0].Header().ID != huge.ID {
		t.Fatalf("the skipped event is not in the events table: %v %v", evs, err)
	}
}
