package client_test

import (
	"reflect"
	"testing"

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
