package client_test

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/client"
	"github.com/ctxpipe/ctxpipe/client/clienttest"
	"github.com/ctxpipe/ctxpipe/internal/natstest"
	"github.com/ctxpipe/ctxpipe/schema"
)

// Tenancy is transparent: against the repository's nats.conf, a tenant's
// agent and UI use the client as anyone would (plain subjects, no tenant
// option), each with what its user may do, and see their tenant only.
func TestTenantUsersOfNATSConf(t *testing.T) {
	_, url := natstest.RunWithConfig(t, "../nats.conf")
	svc := clienttest.New(t, clienttest.WithConn(bus.ConnConfig{URL: url, User: "ctxpipe", Password: "ctxpipe-demo-password"}))
	ctx := t.Context()
	user := func(name string) *client.Client {
		t.Helper()
		c, err := client.Connect(bus.ConnConfig{URL: url, User: name, Password: name + "-demo-password"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}
	agent, ui, other := user("acme-agent"), user("acme-ui"), user("globex-ui")
	live, err := ui.Events(ctx, "c1", client.Replay(0))
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	last := appendTurns(ctx, agent, "c1", 10) // a condense
	h, err := agent.History(ctx, "c1")
	if err != nil || len(h.Messages) != 5 || !h.Messages[1].IsSummary {
		t.Fatalf("agent's history: %v %+v", err, h)
	}
	id, err := ui.Condense(ctx, "c1", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := ui.Wait(ctx, "c1", id); err != nil {
		t.Fatal(err)
	}
	got := collect(t, live, id, schema.EventCondenseContext)
	if want := stored(t, svc, "acme.c1"); !reflect.DeepEqual(ids(got), want) {
		t.Fatalf("the ui saw %d events, %d stored", len(got), len(want))
	}
	if got[1].Header().InputID != last {
		t.Fatalf("the first condense was caused by %s, not the tenth turn", got[1].Header().InputID)
	}
	// A replay, through ctx.q.events, of what happened before.
	again, err := ui.Events(ctx, "c1", client.Replay(0))
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if replayed := collect(t, again, id, schema.EventCondenseContext); !reflect.DeepEqual(ids(replayed), ids(got)) {
		t.Fatalf("replayed %d events, saw %d live", len(replayed), len(got))
	}
	// What a user may not do fails at once, with the server's reason.
	start := time.Now()
	if _, err := agent.Condense(ctx, "c1", ""); !errors.Is(err, nats.ErrPermissionViolation) || time.Since(start) > 5*time.Second {
		t.Fatalf("the agent's condense: %v after %v", err, time.Since(start))
	}
	if _, err := ui.Append(ctx, turn("c1", 10)); !errors.Is(err, nats.ErrPermissionViolation) {
		t.Fatalf("the ui's turn: %v", err)
	}
	// The other tenant has no such conversation.
	if _, err := other.Status(ctx, "c1"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("globex's status of c1: %v", err)
	}
}
