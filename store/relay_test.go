package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ctxpipe/ctxpipe/internal/natstest"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// jsPublisher is the adapter the pipeline uses: jetstream.Publish with the
// event id as Nats-Msg-Id.
type jsPublisher struct{ js jetstream.JetStream }

func (p jsPublisher) Publish(ctx context.Context, subject string, data []byte, msgID string) (uint64, error) {
	ack, err := p.js.Publish(ctx, subject, data, jetstream.WithMsgID(msgID))
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// flakyPublisher fails its first failures calls, then delegates.
type flakyPublisher struct {
	next     Publisher
	mu       sync.Mutex
	failures int
	calls    int
}

func (p *flakyPublisher) Publish(ctx context.Context, subject string, data []byte, msgID string) (uint64, error) {
	p.mu.Lock()
	p.calls++
	fail := p.calls <= p.failures
	p.mu.Unlock()
	if fail {
		return 0, errors.New("publisher down")
	}
	return p.next.Publish(ctx, subject, data, msgID)
}

func eventStream(t *testing.T) (jetstream.JetStream, jetstream.Stream) {
	t.Helper()
	_, url := natstest.Run(t)
	js, err := jetstream.New(natstest.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "CTX_EVENTS",
		Subjects: []string{"ctx.events.>"}, Duplicates: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return js, st
}

// commitEvents commits n inputs across three conversations, each with one or
// two events, and returns the event ids in commit order.
func commitEvents(t *testing.T, s *Store, n int) []string {
	t.Helper()
	var want []string
	var batch []Entry
	for i := range n {
		conv := fmt.Sprintf("conv-%d", i%3)
		e := turnEntry(conv, msg(conv, uuid.NewString(), int64(i), schema.RoleUser, "x"))
		for k := range 1 + i%2 {
			ev := &schema.CondenseFailed{EventHeader: schema.EventHeader{ID: uuid.NewString(),
				Type: schema.EventCondenseFailed, ConversationID: conv, TS: int64(i*10 + k), InputID: e.Input.ID},
				Error: schema.ReasonLLMError}
			e.Changes.Events = append(e.Changes.Events, ev)
			want = append(want, ev.ID)
		}
		batch = append(batch, e)
		if len(batch) == 7 { // several commits, several relay rounds
			commit(t, s, batch...)
			batch = nil
		}
	}
	commit(t, s, batch...)
	return want
}

// streamIDs reads the whole stream back, checking each message against the
// event it carries.
func streamIDs(t *testing.T, st jetstream.Stream) []string {
	t.Helper()
	ctx := context.Background()
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for seq := uint64(1); seq <= info.State.LastSeq; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("GetMsg(%d): %v", seq, err)
		}
		ev, err := schema.DecodeEvent(m.Data)
		if err != nil {
			t.Fatalf("seq %d: %v", seq, err)
		}
		h := ev.Header()
		if id := m.Header.Get(nats.MsgIdHdr); id != h.ID {
			t.Errorf("seq %d: Nats-Msg-Id %q, event id %q", seq, id, h.ID)
		}
		if m.Subject != schema.EventSubject(ev) {
			t.Errorf("seq %d: subject %q, want %q", seq, m.Subject, schema.EventSubject(ev))
		}
		got = append(got, h.ID)
	}
	return got
}

func runRelay(t *testing.T, r *Relay) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

func flush(t *testing.T, r *Relay) {
	t.Helper()
	// The deadline only bounds a broken relay; nothing is asserted on speed.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.Flush(ctx); err != nil {
		t.Fatalf("Flush: %v", err)
	}
}

func equalIDs(t *testing.T, got, want []string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("stream holds %d events, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("stream event %d is %s, want %s (order broken)", i, got[i], want[i])
		}
	}
}

func TestRelayPublishesInOrderExactlyOnce(t *testing.T) {
	tests := []struct {
		name     string
		failures int
		batch    int
	}{
		{"healthy publisher", 0, 5},
		{"publisher fails its first 7 calls", 7, 5},
		{"one row per round", 3, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			js, st := eventStream(t)
			s := openStore(t)
			pub := &flakyPublisher{next: jsPublisher{js}, failures: tc.failures}
			var logs syncBuffer
			r := NewRelay(s, pub, slog.New(slog.NewTextHandler(&logs, nil)), RelayOptions{BatchSize: tc.batch, MinBackoff: time.Millisecond,
				MaxBackoff: 5 * time.Millisecond, PollInterval: 20 * time.Millisecond})
			want := commitEvents(t, s, 20)

			// Flush cannot finish before the relay runs.
			cctx, cancel := context.WithCancel(ctx)
			cancel()
			if err := r.Flush(cctx); !errors.Is(err, context.Canceled) {
				t.Fatalf("Flush with no relay running = %v, want context.Canceled", err)
			}
			runRelay(t, r)
			flush(t, r)
			if n, err := r.Pending(ctx); err != nil || n != 0 {
				t.Fatalf("Pending after Flush = %d, %v", n, err)
			}
			equalIDs(t, streamIDs(t, st), want)
			if pub.calls < len(want)+tc.failures {
				t.Fatalf("%d publish calls, want at least %d", pub.calls, len(want)+tc.failures)
			}
			failed, recovered := strings.Count(logs.String(), "round failed"), strings.Count(logs.String(), "relay recovered")
			if (failed > 0) != (tc.failures > 0) || (failed > 0 && recovered != 1) {
				t.Fatalf("%d failure lines and %d recovery lines, want a recovery line after the failures", failed, recovered)
			}

			// More commits after the first flush, announced with Notify.
			want = append(want, commitEvents(t, s, 4)...)
			r.Notify()
			flush(t, r)
			equalIDs(t, streamIDs(t, st), want)
		})
	}
}

// A crash between publish and mark sends rows again; the event id as
// Nats-Msg-Id makes JetStream drop the copies.
func TestRelayRepublishIsDeduplicated(t *testing.T) {
	ctx := context.Background()
	js, st := eventStream(t)
	s := openStore(t)
	r := NewRelay(s, jsPublisher{js}, nil, RelayOptions{PollInterval: 20 * time.Millisecond})
	want := commitEvents(t, s, 10)
	runRelay(t, r)
	flush(t, r)
	if _, err := s.w.ExecContext(ctx, "UPDATE outbox SET published_at = NULL"); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.Pending(ctx); n != len(want) {
		t.Fatalf("Pending after unmarking = %d, want %d", n, len(want))
	}
	r.Notify()
	flush(t, r)
	equalIDs(t, streamIDs(t, st), want)

	// Pruning forgets published rows; the events table keeps them.
	n, err := s.PruneOutbox(ctx, time.Now().Add(time.Hour))
	if err != nil || n != int64(len(want)) {
		t.Fatalf("PruneOutbox = %d, %v; want %d", n, err, len(want))
	}
	evs, err := s.Events(ctx, "conv-0")
	if err != nil || len(evs) == 0 {
		t.Fatalf("events after prune: %d, %v", len(evs), err)
	}
}

func TestRelayRunReturnsErrClosed(t *testing.T) {
	s, err := Open(context.Background(), t.TempDir()+"/ctx.db")
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	r := NewRelay(s, &flakyPublisher{}, nil, RelayOptions{})
	if err := r.Run(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Run on a closed store = %v, want ErrClosed", err)
	}
}
