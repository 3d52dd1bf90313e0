package client_test

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/ctxpipe/ctxpipe/client"
	"github.com/ctxpipe/ctxpipe/internal/natstest"
	"github.com/ctxpipe/ctxpipe/schema"
)

// badTurn is a turn the service rejects (bad_role): one input_rejected
// event, and nothing else, for each.
func badTurn(conv string) schema.Turn {
	return schema.Turn{ConversationID: conv, Role: "robot", Content: schema.TextContent("x")}
}

// In the service's own account, conversation "acme" is not tenant acme:
// its stream gets none of tenant acme's conversations' events
// (ctx.events.acme.<conv>.<type>), live or replayed.
func TestEventsOfAConversationNamedLikeATenant(t *testing.T) {
	c, svc, _ := newClient(t)
	ctx := t.Context()
	acme, err := client.New(natstest.Connect(t, svc.URL), client.WithTenant("acme"))
	if err != nil {
		t.Fatal(err)
	}
	own, err := c.Append(ctx, badTurn("acme"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Wait(ctx, "acme", own); err == nil {
		t.Fatal("the bad turn was applied")
	}
	s, err := c.Events(ctx, "acme", client.Replay(0))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	collect(t, s, own, schema.EventInputRejected)
	// Tenant acme's conversation c1, then conversation acme again.
	for _, w := range []struct {
		c    *client.Client
		conv string
	}{{acme, "c1"}, {c, "acme"}} {
		id, err := w.c.Append(ctx, badTurn(w.conv))
		if err != nil {
			t.Fatal(err)
		}
		if err := w.c.Wait(ctx, w.conv, id); err == nil {
			t.Fatal("the bad turn was applied")
		}
		own = id
	}
	got := collect(t, s, own, schema.EventInputRejected)
	for _, ev := range got {
		if ev.Header().ConversationID != "acme" {
			t.Errorf("the stream of acme delivered an event of %s", ev.Header().ConversationID)
		}
	}
	if want := stored(t, svc, "acme"); !reflect.DeepEqual(append([]string{want[0]}, ids(got)...), want) {
		t.Fatalf("delivered %v, stored %v", ids(got), want)
	}
}

// A reader that lags loses nothing across reconnects: after each cut the
// stream is blocked handing over an event while the connection comes back
// and new live events queue up behind the reconnect; the events published
// while it was down must still come first, each once, in commit order.
func TestEventsSlowReaderAcrossReconnects(t *testing.T) {
	rig := newCutRig(t, 20*time.Millisecond)
	svc, writer, reader, nc, proxy := rig.svc, rig.writer, rig.reader, rig.nc, rig.proxy
	ctx := t.Context()
	const conv = "slow-reader"
	// reject publishes n bad turns and waits until their events are
	// published; it returns the last one's id.
	reject := func(n int) (last string) {
		t.Helper()
		for range n {
			id, err := writer.Append(ctx, badTurn(conv))
			if err != nil {
				t.Fatal(err)
			}
			last = id
		}
		if err := writer.Wait(ctx, conv, last); !errors.Is(err, client.ErrRejected) {
			t.Fatalf("the last bad turn: %v", err)
		}
		if err := svc.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		return last
	}
	s, err := reader.Events(ctx, conv, client.Replay(0))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got := collect(t, s, reject(2), schema.EventInputRejected)
	// Each round has even odds of losing events to the race: eight of them
	// make a pass by luck unlikely (1 in 256).
	for range 8 {
		// One event the reader does not take yet: the stream blocks on it.
		reject(1)
		time.Sleep(20 * time.Millisecond)
		proxy.cut()
		reject(3) // missed by the subscription
		proxy.restore()
		deadline := time.Now().Add(10 * time.Second) // bounds a broken reconnect only
		for !nc.IsConnected() {
			if time.Now().After(deadline) {
				t.Fatal("the reader did not reconnect")
			}
			time.Sleep(5 * time.Millisecond)
		}
		// The subscriptions are back at the server: these arrive live and
		// queue behind the one the reader has not taken.
		if err := nc.FlushTimeout(10 * time.Second); err != nil {
			t.Fatal(err)
		}
		last := reject(3)
		time.Sleep(50 * time.Millisecond)
		got = append(got, collect(t, s, last, schema.EventInputRejected)...)
	}
	exactlyOnceInOrder(t, ids(got), stored(t, svc, conv))
}

// exactlyOnceInOrder fails t unless delivered is want: it says how many
// events were missing, delivered twice or out of order.
func exactlyOnceInOrder(t *testing.T, delivered, want []string) {
	t.Helper()
	if reflect.DeepEqual(delivered, want) {
		return
	}
	at := map[string]int{}
	for i, id := range want {
		at[id] = i
	}
	count := map[string]int{}
	var dups, foreign, outOfOrder int
	last := -1
	for _, id := range delivered {
		i, ok := at[id]
		switch {
		case !ok:
			foreign++
			continue
		case count[id] > 0:
			dups++
		case i < last:
			outOfOrder++
		}
		count[id]++
		last = max(last, i)
	}
	var missing []int
	for i, id := range want {
		if count[id] == 0 {
			missing = append(missing, i)
		}
	}
	t.Fatalf("stored %d events, delivered %d: missing %d (positions %v), %d twice, %d out of order, %d not stored",
		len(want), len(delivered), len(missing), missing, dups, outOfOrder, foreign)
}
