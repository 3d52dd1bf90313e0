package pipeline_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/ctxpipe/ctxpipe/internal/natstest"
	"github.com/ctxpipe/ctxpipe/pipeline"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/store"
)

// rejectEach publishes one malformed turn on each of n conversations named
// prefix-i: each is rejected, with one input_rejected event.
func rejectEach(h *harness, prefix string, n int) []string {
	convs := make([]string, n)
	for i := range convs {
		convs[i] = fmt.Sprintf("%s-%d", prefix, i)
		h.publishRaw(schema.InputSubject(convs[i], schema.KindTurn), uuid.NewString(), []byte(`{"id": nope`))
	}
	return convs
}

// appliedBy waits until every harness stored one event of each conversation
// (the writer committed it, the others applied its changelog record), and
// returns the event ids.
func appliedBy(t *testing.T, convs []string, hs ...*harness) map[string]bool {
	t.Helper()
	ids := map[string]bool{}
	for _, h := range hs {
		for _, conv := range convs {
			waitFor(t, func() bool {
				evs, err := h.store.Events(context.Background(), conv)
				if err != nil || len(evs) != 1 {
					return false
				}
				ids[evs[0].Header().ID] = true
				return true
			})
		}
	}
	if len(ids) != len(convs) {
		t.Fatalf("%d event ids for %d conversations", len(ids), len(convs))
	}
	return ids
}

// liveCopies drains sub and counts the copies of each event id it got.
func liveCopies(t *testing.T, sub *nats.Subscription) map[string]int {
	t.Helper()
	got := map[string]int{}
	for {
		m, err := sub.NextMsg(100 * time.Millisecond)
		if err != nil {
			return got
		}
		got[m.Header.Get(nats.MsgIdHdr)]++
	}
}

// The relay holds another instance's events back for its hold (a second
// at least in the harness, up to two), then publishes what the stream
// still lacks; past that nothing more comes.
const heldFor = 2*time.Second + 2*time.Second // the longest hold, and a scan's second with room

// With three instances each following the others' changelog records, a
// live subscriber of ctx.events.> gets each event once: only its writer
// publishes it. Every follower's relay published the events of records
// younger than a minute too, and the subscriber got one copy per instance
// (652 messages for 218 events); the stream dropped the copies, live
// subscribers cannot.
func TestLiveEventsArriveOnceAtThreeInstances(t *testing.T) {
	_, url := natstest.Run(t)
	cfg := pipeline.Config{Lanes: 2}
	hs := []*harness{startOn(t, url, cfg, nil), startOn(t, url, cfg, nil), startOn(t, url, cfg, nil)}
	sub, err := hs[0].nc.SubscribeSync("ctx.events.>")
	if err != nil {
		t.Fatal(err)
	}
	convs := rejectEach(hs[0], "once", 40)
	ids := appliedBy(t, convs, hs...)
	time.Sleep(heldFor)
	got := liveCopies(t, sub)
	for id := range ids {
		if got[id] != 1 {
			t.Errorf("event %s reached the live subscriber %d times, want once", id, got[id])
		}
	}
	if len(got) != len(ids) {
		t.Errorf("the live subscriber got %d events, want %d", len(got), len(ids))
	}
	exactlyOnceIn(t, hs[0], ids)
}

// An instance that died before its relay published what it committed
// (here its relay stops first) leaves the events to the instances that
// follow its changelog: each publishes those the stream still lacks when
// its hold ends. The holds differ per instance (a random part), and each
// relay reads the stream when its hold ends, so the first to end its hold
// publishes and the others find the event: a live subscriber gets each
// event at least once and at most once per follower.
func TestWriterDiedItsEventsStillReachTheStream(t *testing.T) {
	_, url := natstest.Run(t)
	cfg := pipeline.Config{Lanes: 2}
	writer := startOn(t, url, cfg, nil)
	writer.stopRelays()
	sub, err := writer.nc.SubscribeSync("ctx.events.>")
	if err != nil {
		t.Fatal(err)
	}
	convs := rejectEach(writer, "died", 30)
	appliedBy(t, convs, writer)
	followers := []*harness{startOn(t, url, cfg, nil), startOn(t, url, cfg, nil)}
	ids := appliedBy(t, convs, followers...)
	time.Sleep(heldFor)
	got := liveCopies(t, sub)
	copies := 0
	for id := range ids {
		if got[id] < 1 || got[id] > len(followers) {
			t.Errorf("event %s reached the live subscriber %d times, want 1 to %d", id, got[id], len(followers))
		}
		copies += got[id] - 1
	}
	t.Logf("%d events, %d live copies", len(ids), copies)
	exactlyOnceIn(t, followers[0], ids)
}

// exactlyOnceIn checks that CTX_EVENTS holds each of ids once and nothing
// else.
func exactlyOnceIn(t *testing.T, h *harness, ids map[string]bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	evs := readEvents(ctx, t, h.js, "ctx.events.>")
	seen := map[string]int{}
	for _, ev := range evs {
		seen[ev.Header().ID]++
	}
	for id := range ids {
		if seen[id] != 1 {
			t.Errorf("CTX_EVENTS holds event %s %d times, want once", id, seen[id])
		}
	}
	if len(seen) != len(ids) {
		t.Errorf("CTX_EVENTS holds %d events, want %d", len(seen), len(ids))
	}
}

// eventEntry is an applied turn of conv with one event, and the event's id.
func eventEntry(conv string) (store.Entry, string) {
	in := uuid.NewString()
	ev := &schema.CondenseFailed{EventHeader: schema.EventHeader{ID: uuid.NewString(), Type: schema.EventCondenseFailed,
		ConversationID: conv, TS: time.Now().UnixMilli(), InputID: in}, Error: schema.ReasonLLMError}
	return store.Entry{
		Input: store.InputRecord{ID: in, ConversationID: conv, Kind: "turn", Subject: schema.InputSubject(conv, schema.KindTurn),
			TS: ev.TS, Payload: []byte(`{}`), Status: store.StatusApplied},
		Changes: &schema.Changes{Events: []schema.Event{ev}},
	}, ev.ID
}

// A held event (another writer's) is published only if the stream lacks it
// when its hold ends, and an event of this instance waits behind a held one
// of its conversation, so that the conversation's events reach the stream
// in commit order; events of other conversations do not wait.
func TestHeldEventsKeepTheirConversationsOrder(t *testing.T) {
	ctx := context.Background()
	nc, js, st := eventsStream(t)
	sub, err := nc.SubscribeSync("ctx.events.>")
	if err != nil {
		t.Fatal(err)
	}
	s, err := store.Open(ctx, filepath.Join(t.TempDir(), "ctxpipe.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	pub := pipeline.JetStreamPublisher{JS: js}
	commit := func(held bool, conv string) string {
		e, id := eventEntry(conv)
		tx, err := s.Begin(ctx, []store.Group{{At: time.Now().UnixMilli(), Entries: []store.Entry{e}, Held: held}})
		if err == nil {
			err = tx.Commit(nil, 0)
		}
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	diedX := commit(true, "x")      // its writer died before publishing it
	publishedY := commit(true, "y") // its writer publishes it
	ownX := commit(false, "x")      // waits behind diedX
	ownZ := commit(false, "z")      // waits for nothing
	relay := store.NewRelay(s, pub, nil, store.RelayOptions{PollInterval: 20 * time.Millisecond, Hold: 300 * time.Millisecond})
	stop := runRelay(relay)
	defer stop()
	e, _ := s.Events(ctx, "y")
	data, err := schema.Marshal(e[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(ctx, schema.EventSubject(e[0]), data, publishedY); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return len(streamIDs(t, st)) == 4 })
	time.Sleep(time.Second) // the longest hold, and more: nothing else comes
	got := streamIDs(t, st)
	pos := map[string]int{}
	for i, id := range got {
		pos[id] = i
	}
	if len(got) != 4 || pos[ownZ] > pos[diedX] || pos[diedX] > pos[ownX] {
		t.Fatalf("stream holds %v, want %s (other conversation, not held back) before %s (held, its writer died) before %s (behind it), and %s once",
			got, ownZ, diedX, ownX, publishedY)
	}
	live := liveCopies(t, sub)
	for _, id := range []string{diedX, publishedY, ownX, ownZ} {
		if live[id] != 1 {
			t.Errorf("event %s reached the live subscriber %d times, want once", id, live[id])
		}
	}
	if n, err := relay.Pending(ctx); err != nil || n != 0 {
		t.Fatalf("Pending = %d, %v; want 0", n, err)
	}
}
