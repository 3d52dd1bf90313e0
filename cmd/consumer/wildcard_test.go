package main

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/schema"
)

// A conversation token that is a literal wildcard, from every user of the
// shipped nats.conf that may send inputs, for every kind it may send: the
// service runs on its embedded server. A '*' is acknowledged by no stream
// and stored nowhere; a '>', which the server cannot be told to refuse, is
// stored where no partition reads it, rejected by the service with an
// input_rejected event its tenant's UIs receive live (the tenant's _invalid
// conversation), and then deleted. Nothing is left in CTX_IN that no
// partition reads, and turns go on.
func TestWildcardConversationTokens(t *testing.T) {
	for _, k := range llmEnv {
		t.Setenv(k, "")
	}
	m := &testMain{Main: NewMain()}
	m.Config.DataDir, m.Config.Listen, m.Config.HTTP = t.TempDir(), "127.0.0.1:-1", ""
	m.Config.Pipeline.StrayInterval = 100 * time.Millisecond
	m.Log = testLogger(t)
	if err := m.Run(context.Background()); err != nil {
		_ = m.Close()
		t.Fatalf("run: %v", err)
	}
	t.Cleanup(func() { _ = m.Close() })
	url := m.ns.ClientURL()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	type sender struct {
		c      *client
		tenant string
		kinds  []schema.InputKind
	}
	var senders []sender
	live := map[string]*nats.Subscription{}
	for _, tn := range []string{"acme", "globex"} {
		senders = append(senders,
			sender{connectAs(t, url, tn+"-agent"), tn, []schema.InputKind{schema.KindTurn, schema.KindOverflow}},
			sender{connectAs(t, url, tn+"-ui"), tn, []schema.InputKind{schema.KindCondense, schema.KindRewind, schema.KindPin}})
		ui := connectAs(t, url, tn+"-ui")
		sub, err := ui.nc.SubscribeSync("ctx.events." + schema.InvalidConversationID + ".input_rejected")
		if err != nil {
			t.Fatal(err)
		}
		if err := ui.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		live[tn] = sub
	}
	payload := func(id string) []byte {
		return fmt.Appendf(nil, `{"id":%q,"conversation_id":"c1","ts":1,"role":"user","content":"hi","trigger":"manual","message_id":%q}`, id, id)
	}

	// '*': no acknowledgement, all at once (the wait only bounds how long
	// an answer that must not come is waited for; what CTX_IN holds is
	// checked at the end).
	starIDs := map[string]string{}
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, s := range senders {
		for _, k := range s.kinds {
			subj := schema.InputSubject("*", k)
			id := uuid.NewString()
			starIDs[id] = s.tenant + " " + subj
			wg.Add(1)
			go func() {
				defer wg.Done()
				pctx, cancel := context.WithTimeout(ctx, time.Second)
				defer cancel()
				if ack, err := s.c.js.Publish(pctx, subj, payload(id)); err == nil {
					mu.Lock()
					defer mu.Unlock()
					t.Errorf("%s %s: acknowledged %+v", s.tenant, subj, ack)
				}
			}()
		}
	}
	wg.Wait()

	// '>': acknowledged, then rejected.
	want := map[string]map[string]schema.InputKind{} // tenant → id → kind
	for _, s := range senders {
		for _, k := range s.kinds {
			id := uuid.NewString()
			// Raw: bus.PublishInput refuses a wildcard token itself.
			ack, err := s.c.js.Publish(ctx, schema.InputSubject(">", k), payload(id))
			if err != nil {
				t.Fatalf("%s %s: %v", s.tenant, k, err)
			}
			if ack.Duplicate {
				t.Fatalf("%s %s: %+v", s.tenant, k, ack)
			}
			if want[s.tenant] == nil {
				want[s.tenant] = map[string]schema.InputKind{}
			}
			want[s.tenant][id] = k
		}
	}
	// The service's own user, as the dashboard: its control inputs with a
	// '>' token are strays too.
	svcJS, err := jetstream.New(m.nc)
	if err != nil {
		t.Fatal(err)
	}
	dashID := uuid.NewString()
	if _, err := svcJS.Publish(ctx, "ctx.in.acme.>.condense", payload(dashID)); err != nil {
		t.Fatalf("the service's condense with a '>' token: %v", err)
	}
	want["acme"][dashID] = schema.KindCondense
	noTenantID := uuid.NewString()
	if _, err := svcJS.Publish(ctx, "ctx.in.>.c1.rewind", payload(noTenantID)); err != nil {
		t.Fatalf("the service's rewind with a '>' tenant: %v", err)
	}

	for tn, ids := range want {
		for left := len(ids); left > 0; {
			msg, err := live[tn].NextMsg(30 * time.Second)
			if err != nil {
				t.Fatalf("%s's UI: %d rejections still missing: %v", tn, left, err)
			}
			ev, err := schema.DecodeEvent(msg.Data)
			if err != nil {
				t.Fatal(err)
			}
			rej, ok := ev.(*schema.InputRejected)
			if !ok {
				t.Fatalf("%s's UI: %s on %s", tn, ev.Header().Type, msg.Subject)
			}
			k, mine := ids[rej.InputID]
			if !mine {
				t.Fatalf("%s's UI received the rejection of %s (%s), not one of its inputs", tn, rej.InputID, rej.Subject)
			}
			if rej.Reason != schema.ReasonBadConversationID || rej.Subject != "ctx.in."+tn+".>."+string(k) || rej.ConversationID != tn+"."+schema.InvalidConversationID {
				t.Fatalf("%s's UI: %+v", tn, rej)
			}
			delete(ids, rej.InputID)
			left--
		}
	}
	// The rejection without a tenant is the service's to see, in the file
	// of whichever partition took it.
	waitUntil(t, func() bool {
		for _, st := range m.stores.Files() {
			evs, err := st.Events(ctx, schema.InvalidConversationID)
			if err != nil {
				t.Fatal(err)
			}
			for _, ev := range evs {
				if r, ok := ev.(*schema.InputRejected); ok && r.InputID == noTenantID && r.Reason == schema.ReasonBadSubject {
					return true
				}
			}
		}
		return false
	})

	// Nothing of the '*' inputs is in CTX_IN, and nothing is left there
	// that no partition reads: the strays are deleted once rejected.
	in, err := svcJS.Stream(ctx, bus.StreamIn)
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, func() bool {
		info, err := in.Info(ctx, jetstream.WithSubjectFilter(bus.StraySubjects))
		return err == nil && len(info.State.Subjects) == 0
	})
	oc, err := svcJS.OrderedConsumer(ctx, bus.StreamIn, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	info, err := oc.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for range info.NumPending {
		raw, err := oc.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if what, star := starIDs[schema.PeekID(raw.Data())]; star {
			t.Fatalf("CTX_IN holds %s as %s", what, raw.Subject())
		}
		if !bus.Reached(raw.Subject(), bus.DefaultPartitions) {
			t.Fatalf("CTX_IN still holds %s, which no partition reads", raw.Subject())
		}
	}

	agent := connectAs(t, url, "acme-agent")
	turn := schema.Turn{ID: uuid.NewString(), ConversationID: "after-wildcards", TS: time.Now().UnixMilli(), Role: schema.RoleUser, Content: schema.TextContent("still here")}
	agent.publishTurn(turn)
	if msgs := agent.mustHistory(turn.ConversationID, schema.ViewFull, turn.ID); len(msgs) != 1 {
		t.Fatalf("a turn after the wildcards: %d messages", len(msgs))
	}
}

// waitUntil polls ok until it holds; the 30 s only bound a failure.
func waitUntil(t *testing.T, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !ok(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 30s")
		}
	}
}
