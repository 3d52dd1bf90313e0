package main

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/schema"
)

// decisions returns the events of conv (as the tenant's ctx.q.events replays
// them) that input id caused, and every input_rejected event of conv.
func (c *client) decisions(conv, id string) (caused, rejected []schema.Event) {
	c.t.Helper()
	var rep schema.EventsReply
	if err := c.query(schema.SubjectEvents, schema.EventsRequest{ConversationID: conv}, &rep, 10*time.Second); err != nil {
		if qe, ok := err.(*schema.QueryErrorBody); ok && qe.Code == schema.QueryNotFound {
			return nil, nil
		}
		c.t.Fatalf("events of %s: %v", conv, err)
	}
	for _, raw := range rep.Events {
		ev, err := schema.DecodeEvent(raw)
		if err != nil {
			c.t.Fatal(err)
		}
		if ev.Header().InputID == id {
			caused = append(caused, ev)
		}
		if ev.Header().Type == schema.EventInputRejected {
			rejected = append(rejected, ev)
		}
	}
	return caused, rejected
}

// Input ids are one namespace per tenant. acme and globex send the same
// turns' ids and the same condense id, at the same moment, through the
// shipped nats.conf; each tenant's inputs are applied as its own, neither is
// rejected nor told that the other used the id (no duplicate PubAck, no
// duplicate_id), and each gets its own events. Within one tenant an id stays
// taken.
func TestTenantsShareNoInputIDs(t *testing.T) {
	m := mustRunMain(t, t.TempDir())
	url := m.ns.ClientURL()
	tenants := []string{"acme", "globex"}
	agents, uis := map[string]*client{}, map[string]*client{}
	for _, tn := range tenants {
		agents[tn], uis[tn] = connectAs(t, url, tn+"-agent"), connectAs(t, url, tn+"-ui")
	}
	const conv = "same-ids"
	ts := time.Now().UnixMilli()
	ids := []string{uuid.NewString(), uuid.NewString(), uuid.NewString()}
	roles := []schema.Role{schema.RoleUser, schema.RoleAssistant, schema.RoleUser}
	turn := func(tn string, i int) schema.Turn {
		return schema.Turn{ID: ids[i], ConversationID: conv, TS: ts + int64(i), Role: roles[i],
			Content: schema.TextContent(tn + " says " + strings.Repeat("hello ", i+1))}
	}
	// Both tenants at once: each PubAck is a new input, never a duplicate.
	var wg sync.WaitGroup
	for _, tn := range tenants {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range ids {
				tu := turn(tn, i)
				data, err := schema.Marshal(tu)
				if err != nil {
					t.Error(err)
					return
				}
				ack, err := bus.PublishInput(context.Background(), agents[tn].js, schema.InputSubject(conv, schema.KindTurn), tu.ID, data)
				if err != nil || ack.Duplicate {
					t.Errorf("%s turn %d: ack %+v, %v", tn, i, ack, err)
				}
			}
		}()
	}
	wg.Wait()
	for _, tn := range tenants {
		msgs := agents[tn].mustHistory(conv, schema.ViewFull, ids[2])
		if len(msgs) != len(ids) {
			t.Fatalf("%s holds %d messages, want %d", tn, len(msgs), len(ids))
		}
		for i, msg := range msgs {
			if msg.ID != ids[i] || msg.ConversationID != tn+"."+conv || msg.Content.Text != turn(tn, i).Content.Text {
				t.Fatalf("%s message %d: %s in %s %q, want its own", tn, i, msg.ID, msg.ConversationID, msg.Content.Text)
			}
		}
	}

	// The same condense id from both UIs: each tenant's decision, under an
	// event id of its own.
	cond := uuid.NewString()
	for _, tn := range tenants {
		in := schema.Input{ID: cond, ConversationID: conv, TS: ts + 10, Trigger: schema.TriggerManual}
		data, err := schema.ControlPayload(in)
		if err != nil {
			t.Fatal(err)
		}
		if ack, err := bus.PublishInput(context.Background(), uis[tn].js, schema.InputSubject(conv, schema.KindCondense), cond, data); err != nil || ack.Duplicate {
			t.Fatalf("%s condense: ack %+v, %v", tn, ack, err)
		}
	}
	eventIDs := map[string]string{}
	for _, tn := range tenants {
		if _, err := uis[tn].history(conv, schema.ViewFull, cond, 30*time.Second); err != nil {
			t.Fatalf("%s waits for its condense: %v", tn, err)
		}
		caused, rejected := uis[tn].decisions(conv, cond)
		if len(rejected) != 0 {
			t.Fatalf("%s was told of a rejection: %+v", tn, rejected[0])
		}
		if len(caused) == 0 {
			t.Fatalf("%s has no event of its condense", tn)
		}
		for _, ev := range caused {
			h := ev.Header()
			if h.ConversationID != tn+"."+conv {
				t.Fatalf("%s replays an event of %s", tn, h.ConversationID)
			}
			if other, dup := eventIDs[h.ID]; dup {
				t.Fatalf("event %s is both %s's and %s's", h.ID, other, tn)
			}
			eventIDs[h.ID] = tn
		}
	}

	// An id acme used in one conversation, globex may use in another;
	// within acme, the id stays taken.
	own := schema.Turn{ID: uuid.NewString(), ConversationID: "acme-only", TS: ts + 20, Role: schema.RoleUser, Content: schema.TextContent("acme's")}
	agents["acme"].publishTurn(own)
	agents["acme"].mustHistory("acme-only", schema.ViewFull, own.ID)
	elsewhere := own
	elsewhere.ConversationID, elsewhere.Content = "elsewhere", schema.TextContent("mine too")
	agents["globex"].publishTurn(elsewhere)
	if msgs := agents["globex"].mustHistory("elsewhere", schema.ViewFull, own.ID); len(msgs) != 1 {
		t.Fatalf("globex's elsewhere holds %d messages, want 1", len(msgs))
	}
	agents["acme"].publishTurn(elsewhere)
	_, err := agents["acme"].history("elsewhere", schema.ViewFull, own.ID, 30*time.Second)
	if qe, ok := err.(*schema.QueryErrorBody); !ok || qe.Code != schema.QueryInputRejected || !strings.Contains(qe.Message, string(schema.ReasonDuplicateID)) {
		t.Fatalf("acme reusing its own id in another conversation: %v, want input_rejected (duplicate_id)", err)
	}
}
