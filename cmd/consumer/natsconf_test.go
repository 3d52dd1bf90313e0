package main

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/internal/natstest"
	"github.com/ctxpipe/ctxpipe/schema"
)

// TestServiceUnderNatsConf runs the real service against a server started
// from the repo's nats.conf, as its least-privilege ctxpipe user: it must be
// able to do everything it does (streams, KV watch, consumer reset on a
// restart, queue-group queries, events), with tenant acme's agent and UI
// users as clients.
func TestServiceUnderNatsConf(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts two services")
	}
	_, url := natstest.RunWithConfig(t, "../../nats.conf")
	dir := t.TempDir()
	run := func() *testMain {
		t.Helper()
		for _, k := range llmEnv {
			t.Setenv(k, "")
		}
		m := &testMain{Main: NewMain()}
		m.Config.DataDir, m.Config.HTTP = dir, ""
		m.Config.NATS = bus.ConnConfig{URL: url, User: "ctxpipe", Password: "ctxpipe-demo-password"}
		m.Log = testLogger(t)
		if err := m.Run(context.Background()); err != nil {
			_ = m.Close()
			t.Fatalf("run as ctxpipe under nats.conf: %v", err)
		}
		t.Cleanup(func() { _ = m.Close() })
		return m
	}
	// A tenant's users, each with the inbox prefix nats.conf allows it
	// (bus.ConnConfig derives the same from --nats-user).
	user := func(name string) *client {
		return connect(t, url, nats.UserInfo(name, name+"-demo-password"), nats.CustomInboxPrefix("_INBOX_"+name))
	}
	svc := run()
	agent := user("acme-agent")
	ui := user("acme-ui")

	rng := rand.New(rand.NewPCG(3, 3))
	const conv = "under-conf"
	var last schema.Turn
	ts := time.Now().UnixMilli()
	for i := 0; i < 20; i++ {
		last = textTurn(rng, conv, "demo-16k", i, ts+int64(i), 600)
		agent.publishTurn(last)
	}
	if full := agent.mustHistory(conv, schema.ViewFull, last.ID); len(full) <= 20 {
		t.Fatalf("no condense under nats.conf: %d messages", len(full))
	}
	// The UI asks for a condense and sees the decision twice: live on its
	// account's ctx.events.<conv>.> (imported from CTX's
	// ctx.events.acme.<conv>.>), and replayed through ctx.q.events (tenant
	// accounts have no JetStream of their own).
	live, err := ui.nc.SubscribeSync("ctx.events." + conv + ".>")
	if err != nil {
		t.Fatal(err)
	}
	in := schema.Input{ID: uuid.NewString(), ConversationID: conv, TS: ts + 100, Trigger: schema.TriggerManual}
	data, _ := schema.ControlPayload(in)
	if _, err := bus.PublishInput(context.Background(), ui.js, schema.InputSubject(conv, schema.KindCondense), in.ID, data); err != nil {
		t.Fatalf("ui condense: %v", err)
	}
	if _, err := ui.history(conv, schema.ViewEffective, in.ID, 10*time.Second); err != nil {
		t.Fatalf("ui history: %v", err)
	}
	// Whatever the outcome (a condense, or condense_failed when the context
	// would not shrink), the ui sees the decision its input caused.
	decision := func(ev schema.Event) bool {
		h := ev.Header()
		return h.InputID == in.ID && (h.Type == schema.EventCondenseContext || h.Type == schema.EventCondenseFailed)
	}
	for seen := 0; ; seen++ {
		m, err := live.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("the ui saw no live decision on its condense among %d events: %v", seen, err)
		}
		if ev, err := schema.DecodeEvent(m.Data); err == nil && decision(ev) {
			break
		}
	}
	var rep schema.EventsReply
	if err := ui.query(schema.SubjectEvents, schema.EventsRequest{ConversationID: conv}, &rep, 5*time.Second); err != nil {
		t.Fatalf("ui replays events: %v", err)
	}
	replayed := false
	for _, raw := range rep.Events {
		ev, err := schema.DecodeEvent(raw)
		if err != nil {
			t.Fatal(err)
		}
		replayed = replayed || decision(ev)
	}
	if !replayed {
		t.Fatalf("ctx.q.events replayed %d events without the decision", len(rep.Events))
	}
	// A restart resets the durable consumer at its ack floor: the service
	// user must be allowed to, and the next turn must still land.
	if err := svc.Close(); err != nil {
		t.Fatal(err)
	}
	run()
	next := textTurn(rng, conv, "demo-16k", 20, ts+200, 50)
	agent.publishTurn(next)
	if eff := agent.mustHistory(conv, schema.ViewEffective, next.ID); eff[len(eff)-1].ID != next.ID {
		t.Fatal("the turn after the restart is not last in the effective history")
	}
}
