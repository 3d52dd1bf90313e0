package pipeline_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ctxpipe/ctxpipe/schema"
)

// Two tenants' conversations with the same id never meet: inputs arrive as
// ctx.in.<tenant>.<conv>.<kind> (the server maps each tenant's account
// there), queries as ctx.q.<tenant>.<verb>, and events leave on
// ctx.events.<tenant>.<conv>.<type>. A query for another tenant's
// conversation answers not_found, as for one that does not exist.
func TestTenantsNeverMeet(t *testing.T) {
	h := start(t)
	secret := map[string]string{"acme": "acme's secret plan", "globex": "globex's launch codes"}
	last := map[string]string{}
	for _, tenant := range []string{"acme", "globex"} {
		for i := range 3 {
			role := schema.RoleUser
			if i%2 == 1 {
				role = schema.RoleAssistant
			}
			tn := schema.Turn{ID: uuid.NewString(), ConversationID: "c1", TS: h.nextTS(), Role: role, Content: schema.TextContent(secret[tenant])}
			h.publish(schema.InputSubjectPrefix+tenant+".c1.turn", tn.ID, tn)
			last[tenant] = tn.ID
		}
	}
	h.publish(schema.InputSubjectPrefix+"acme.only-acme.turn", uuid.NewString(),
		schema.Turn{ID: uuid.NewString(), ConversationID: "only-acme", TS: h.nextTS(), Role: schema.RoleUser, Content: schema.TextContent("x")})
	ask := func(tenant string, verb schema.QueryVerb, req any, rep any) error {
		data, _ := json.Marshal(req)
		msg, err := h.nc.Request(schema.QuerySubject(tenant, verb), data, 15*time.Second)
		if err != nil {
			t.Fatalf("%s %s: %v", tenant, verb, err)
		}
		return schema.DecodeQueryReply(msg.Data, rep)
	}
	for tenant, other := range map[string]string{"acme": "globex", "globex": "acme"} {
		var rep schema.HistoryReply
		if err := ask(tenant, schema.VerbHistory, schema.HistoryRequest{ConversationID: "c1", View: schema.ViewFull, WaitFor: last[tenant], TimeoutMS: 10_000}, &rep); err != nil {
			t.Fatalf("%s history: %v", tenant, err)
		}
		if rep.ConversationID != "c1" || len(rep.Messages) != 3 {
			t.Fatalf("%s history: %q with %d messages", tenant, rep.ConversationID, len(rep.Messages))
		}
		for _, m := range rep.Messages {
			if strings.Contains(m.Content.Text, secret[other]) || m.ConversationID != tenant+".c1" {
				t.Fatalf("%s read %q of conversation %q", tenant, m.Content.Text, m.ConversationID)
			}
		}
		// An incremental read (after the seq just read; the recent index
		// answers it) holds this tenant's new turn and nothing else.
		more := schema.Turn{ID: uuid.NewString(), ConversationID: "c1", TS: h.nextTS(), Role: schema.RoleUser, Content: schema.TextContent(secret[tenant] + ", part two")}
		h.publish(schema.InputSubjectPrefix+tenant+".c1.turn", more.ID, more)
		var inc schema.HistoryReply
		if err := ask(tenant, schema.VerbHistory, schema.HistoryRequest{ConversationID: "c1", View: schema.ViewFull, WaitFor: more.ID, TimeoutMS: 10_000, After: rep.Seq}, &inc); err != nil {
			t.Fatalf("%s incremental history: %v", tenant, err)
		}
		if inc.Reset || len(inc.Messages) != 1 || inc.Messages[0].ID != more.ID || inc.Messages[0].ConversationID != tenant+".c1" {
			t.Fatalf("%s incremental history after %d: %+v", tenant, rep.Seq, inc)
		}
		var st schema.StatusReply
		if err := ask(tenant, schema.VerbStatus, schema.StatusRequest{ConversationID: "c1"}, &st); err != nil || st.Messages != 4 {
			t.Fatalf("%s status: %+v %v", tenant, st, err)
		}
	}
	// A tenant token no tenant may have (reserved, or naming a key) is
	// refused, never turned into a conversation key.
	for _, bad := range []string{"_invalid", "_acme"} {
		var st schema.StatusReply
		var qe *schema.QueryErrorBody
		if err := ask(bad, schema.VerbStatus, schema.StatusRequest{ConversationID: "c1"}, &st); !errors.As(err, &qe) || qe.Code != schema.QueryBadRequest {
			t.Fatalf("status as tenant %q: %v", bad, err)
		}
	}
	// globex asks for acme's conversation: not_found, as if it did not exist.
	var qe *schema.QueryErrorBody
	var st schema.StatusReply
	if err := ask("globex", schema.VerbStatus, schema.StatusRequest{ConversationID: "only-acme"}, &st); !errors.As(err, &qe) || qe.Code != schema.QueryNotFound {
		t.Fatalf("globex status of acme's conversation: %v", err)
	}
	var hr schema.HistoryReply
	if err := ask("globex", schema.VerbHistory, schema.HistoryRequest{ConversationID: "only-acme"}, &hr); !errors.As(err, &qe) || qe.Code != schema.QueryNotFound {
		t.Fatalf("globex history of acme's conversation: %v", err)
	}
	// The events of a rejected acme input go to acme's subject only, and
	// ctx.q.events replays them for acme alone.
	bad := uuid.NewString()
	h.publishRaw(schema.InputSubjectPrefix+"acme.c1.turn", bad, []byte(`{"id":"`+bad+`","conversation_id":"c1","ts":5,"role":"robot","content":"x"}`))
	if err := ask("acme", schema.VerbHistory, schema.HistoryRequest{ConversationID: "c1", WaitFor: bad, TimeoutMS: 10_000}, &hr); err == nil || !strings.Contains(err.Error(), "rejected") {
		t.Fatalf("wait_for the bad input: %v", err)
	}
	if evs := h.events("acme.c1"); len(evs) != 1 || evs[0].Header().InputID != bad {
		t.Fatalf("acme events %d", len(evs))
	}
	if evs := h.events("globex.c1"); len(evs) != 0 {
		t.Fatalf("globex got %d events", len(evs))
	}
	var er schema.EventsReply
	if err := ask("acme", schema.VerbEvents, schema.EventsRequest{ConversationID: "c1"}, &er); err != nil || len(er.Events) != 1 || er.More {
		t.Fatalf("acme events query: %d events, %v", len(er.Events), err)
	}
	if err := ask("globex", schema.VerbEvents, schema.EventsRequest{ConversationID: "c1"}, &er); err != nil || len(er.Events) != 0 {
		t.Fatalf("globex events query: %d events, %v", len(er.Events), err)
	}
}
