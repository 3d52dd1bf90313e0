package pipeline_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
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
)

// rejections returns conv's input_rejected events by input id.
func rejections(h *harness, conv string) map[string]schema.Reason {
	out := map[string]schema.Reason{}
	for _, e := range h.events(conv) {
		if r, ok := e.(*schema.InputRejected); ok {
			out[r.InputID] = r.Reason
		}
	}
	return out
}

// An input id reused with other content, or in another conversation, is
// rejected duplicate_id; the same input again stays a silent no-op; and
// wait_for does not confuse conversations.
func TestReusedInputIDIsRejected(t *testing.T) {
	h := start(t)
	first := h.turn("owner", schema.RoleUser, 10)
	h.history("owner", schema.ViewFull, first.ID)

	// The same id with other content in the same conversation.
	changed := first
	changed.Content = schema.TextContent("something else entirely")
	h.publish(schema.InputSubject("owner", schema.KindTurn), uuid.NewString(), changed)
	// The same id in another conversation: an agent waiting for it there
	// must not be told it landed.
	other := first
	other.ConversationID = "thief"
	h.publish(schema.InputSubject("thief", schema.KindTurn), uuid.NewString(), other)
	// The very same bytes again (after the stream's dedup window): silent.
	data, _ := schema.Marshal(first)
	h.publishRaw(schema.InputSubject("owner", schema.KindTurn), uuid.NewString(), data)

	next := h.turn("owner", schema.RoleAssistant, 10)
	if full := h.history("owner", schema.ViewFull, next.ID); len(full) != 2 || full[0].Content.Text != first.Content.Text {
		t.Fatalf("owner history: %d messages: %+v", len(full), full)
	}
	rej := rejections(h, "owner")
	if len(rej) != 1 || rej[first.ID] != schema.ReasonDuplicateID {
		t.Fatalf("owner rejections %v, want one duplicate_id for %s", rej, first.ID)
	}
	if rej := rejections(h, "thief"); rej[first.ID] != schema.ReasonDuplicateID {
		t.Fatalf("thief rejections %v, want duplicate_id", rej)
	}
	req, _ := json.Marshal(schema.HistoryRequest{ConversationID: "thief", WaitFor: first.ID, TimeoutMS: 300})
	msg, err := h.nc.Request(schema.SubjectHistory, req, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var rep schema.HistoryReply
	if err := schema.DecodeQueryReply(msg.Data, &rep); err == nil {
		t.Fatalf("wait_for in another conversation answered %d messages: the agent is told its turn landed", len(rep.Messages))
	}
	// ... it is told its input was rejected, and why, rather than left to
	// time out: after the commit, from the store,
	if _, qe, _ := h.historyReq(schema.HistoryRequest{ConversationID: "thief", WaitFor: first.ID}); qe == nil ||
		qe.Code != schema.QueryInputRejected || !strings.Contains(qe.Message, string(schema.ReasonDuplicateID)) {
		t.Fatalf("wait_for the reused id where it was rejected: %+v", qe)
	}
	// and while it waits, from the commit.
	answered := make(chan []byte, 1)
	go func() {
		req, _ := json.Marshal(schema.HistoryRequest{ConversationID: "thief2", WaitFor: first.ID, TimeoutMS: 10000})
		msg, err := h.nc.Request(schema.SubjectHistory, req, 15*time.Second)
		if err != nil {
			answered <- []byte(err.Error())
			return
		}
		answered <- msg.Data
	}()
	time.Sleep(200 * time.Millisecond) // the wait is registered
	again := first
	again.ConversationID = "thief2"
	h.publish(schema.InputSubject("thief2", schema.KindTurn), uuid.NewString(), again)
	select {
	case data := <-answered:
		var qe schema.QueryError
		if json.Unmarshal(data, &qe) != nil || qe.Error.Code != schema.QueryInputRejected {
			t.Fatalf("a wait in progress for the reused id: %s", data)
		}
	case <-time.After(8 * time.Second):
		t.Fatal("a wait in progress for the reused id was not answered by its rejection")
	}
}

// A control input on a conversation that has no turn is rejected and
// creates nothing: a real conversation using the id later auto-condenses.
func TestControlOnUnknownConversationStoresNothing(t *testing.T) {
	h := start(t)
	id := h.control("ghost", schema.KindOverflow, schema.Input{})
	h.control("ghost", schema.KindCondense, schema.Input{Trigger: schema.TriggerManual})
	req, _ := json.Marshal(schema.HistoryRequest{ConversationID: "ghost", WaitFor: id})
	msg, err := h.nc.Request(schema.SubjectHistory, req, 5*time.Second)
	if err != nil || !strings.Contains(string(msg.Data), string(schema.QueryInputRejected)) {
		t.Fatalf("wait_for the overflow: %s %v", msg.Data, err)
	}
	if _, found, err := h.store.State(context.Background(), "ghost"); err != nil || found {
		t.Fatalf("a control input created the conversation (found=%v, %v)", found, err)
	}
	for _, r := range rejections(h, "ghost") {
		if r != schema.ReasonUnknownConversation {
			t.Fatalf("reason %s, want unknown_conversation", r)
		}
	}
	// The id used for real: it condenses as any other.
	ts := h.turns("ghost", 10, 200)
	if eff := h.history("ghost", schema.ViewEffective, ts[len(ts)-1].ID); !slices.ContainsFunc(eff, func(m schema.Message) bool { return m.IsSummary }) {
		t.Fatalf("the conversation never condensed: %d effective messages", len(eff))
	}
}

// Any number of pending wait_for requests never delays a status query:
// waits have slots of their own, so 256 of them leave the query slots free.
func TestWaitFloodDoesNotBlockQueries(t *testing.T) {
	h := start(t)
	t1 := h.turn("busy", schema.RoleUser, 10)
	h.history("busy", schema.ViewFull, t1.ID)

	const waits = 600
	var wg sync.WaitGroup
	for range waits {
		req, _ := json.Marshal(schema.HistoryRequest{ConversationID: "busy", WaitFor: uuid.NewString(), TimeoutMS: 60_000})
		inbox := h.nc.NewRespInbox()
		if err := h.nc.PublishRequest(schema.SubjectHistory, inbox, req); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // let the waits park
	lat := make([]time.Duration, 50)
	for i := range lat {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := json.Marshal(schema.StatusRequest{ConversationID: "busy"})
			t0 := time.Now()
			msg, err := h.nc.Request(schema.SubjectStatus, req, 5*time.Second)
			lat[i] = time.Since(t0)
			if err != nil {
				t.Errorf("status with %d waits pending: %v", waits, err)
				return
			}
			var rep schema.StatusReply
			if err := schema.DecodeQueryReply(msg.Data, &rep); err != nil || rep.Messages != 1 {
				t.Errorf("status reply %s: %v", msg.Data, err)
			}
		}()
	}
	wg.Wait()
	slices.Sort(lat)
	t.Logf("status with %d waits pending: p50 %v, p99 %v", waits, lat[len(lat)/2], lat[len(lat)*99/100])
}

// A history larger than one NATS message gets an answer, never silence: a
// too_large error naming the size, and pages with limit and next_cursor.
func TestLargeHistoryIsPaged(t *testing.T) {
	h := start(t, schema.Profile{ID: schema.DefaultProfileID, ContextWindow: 10_000_000, MaxTokens: 1000})
	// Many short words: cheap to count, unlike one 3 MiB word.
	big := strings.Repeat("word ", 3<<20/5)
	var last schema.Turn
	for i := range 3 {
		role := schema.RoleUser
		if i%2 == 1 {
			role = schema.RoleAssistant
		}
		last = schema.Turn{ID: uuid.NewString(), ConversationID: "big", TS: h.nextTS(), Role: role, Content: schema.TextContent(big)}
		h.publish(schema.InputSubject("big", schema.KindTurn), last.ID, last)
	}
	ask := func(req schema.HistoryRequest) (schema.HistoryReply, error) {
		req.ConversationID = "big"
		data, _ := json.Marshal(req)
		msg, err := h.nc.Request(schema.SubjectHistory, data, 70*time.Second)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		var rep schema.HistoryReply
		return rep, schema.DecodeQueryReply(msg.Data, &rep)
	}
	_, err := ask(schema.HistoryRequest{View: schema.ViewFull, WaitFor: last.ID, TimeoutMS: 60_000})
	var qe *schema.QueryErrorBody
	if !errors.As(err, &qe) || qe.Code != schema.QueryTooLarge || !strings.Contains(qe.Message, "bytes") {
		t.Fatalf("whole history: %v, want too_large with the size", err)
	}
	var ids []string
	cursor := ""
	for page := 0; ; page++ {
		rep, err := ask(schema.HistoryRequest{View: schema.ViewFull, Limit: 1, Cursor: cursor})
		if err != nil {
			t.Fatalf("page %d: %v", page, err)
		}
		if rep.Total != 3 || len(rep.Messages) != 1 {
			t.Fatalf("page %d: %d messages of %d", page, len(rep.Messages), rep.Total)
		}
		ids = append(ids, rep.Messages[0].ID)
		if rep.NextCursor == "" {
			break
		}
		cursor = rep.NextCursor
	}
	if len(ids) != 3 || ids[2] != last.ID {
		t.Fatalf("pages gave %v", ids)
	}
	if _, err := ask(schema.HistoryRequest{View: schema.ViewFull, Limit: 1, Cursor: "2.not-the-id"}); !errors.As(err, &qe) || qe.Code != schema.QueryBadRequest {
		t.Fatalf("a cursor that does not continue the history: %v", err)
	}
}

// The service never publishes a reply outside an inbox: a forged reply
// subject cannot overwrite a profile or plant an event.
func TestForgedReplySubjectsChangeNothing(t *testing.T) {
	h := start(t)
	t1 := h.turn("victim", schema.RoleUser, 10)
	h.history("victim", schema.ViewFull, t1.ID)
	ctx := context.Background()
	kv, err := bus.EnsureProfiles(ctx, h.js)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "default", []byte(`{"id":"default","context_window":4000}`)); err != nil {
		t.Fatal(err)
	}
	before, err := kv.Get(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	evBefore := len(h.events("victim"))
	sub, err := h.nc.SubscribeSync("ctx.events.victim.>")
	if err != nil {
		t.Fatal(err)
	}
	status, _ := json.Marshal(schema.StatusRequest{ConversationID: "victim"})
	for _, reply := range []string{"$KV.ctx_profiles.default", "ctx.events.victim.condense_context", "$JS.API.STREAM.DELETE.CTX_IN", "_INBOX.>", "_INBOX"} {
		if err := h.nc.PublishMsg(&nats.Msg{Subject: schema.SubjectStatus, Reply: reply, Data: status}); err != nil {
			t.Fatal(err)
		}
	}
	// A real query after the forged ones is answered, so they were handled.
	h.status("victim")
	after, err := kv.Get(ctx, "default")
	if err != nil || after.Revision() != before.Revision() || string(after.Value()) != string(before.Value()) {
		t.Fatalf("profile default changed: revision %d → %d (%v)", before.Revision(), after.Revision(), err)
	}
	if m, err := sub.NextMsg(200 * time.Millisecond); err == nil {
		t.Fatalf("a reply landed on %s: %s", m.Subject, m.Data)
	}
	if n := len(h.events("victim")); n != evBefore {
		t.Fatalf("CTX_EVENTS holds %d events for victim, %d before", n, evBefore)
	}
	if _, err := h.js.Stream(ctx, bus.StreamIn); err != nil {
		t.Fatalf("CTX_IN: %v", err)
	}
	if n := h.metrics.Value("ctxpipe_queries_refused_total", ""); n != 5 {
		t.Fatalf("%v queries refused, want 5", n)
	}
}

func TestSafeReply(t *testing.T) {
	for _, tc := range []struct {
		subject string
		ok      bool
	}{
		{"_INBOX.abc.def", true},
		{"_INBOX_acme.abc", true},
		{"_R_.xyz.abc", true},
		{"_INBOX.>", false},
		{"_INBOX.*", false},
		{"_INBOX", false},
		{"_INBOX.", false},
		{"_INBOXES", false},
		{"$KV.ctx_profiles.default", false},
		{"$JS.API.STREAM.DELETE.CTX_IN", false},
		{"ctx.events.x.rewind", false},
		{"", false},
	} {
		if got := pipeline.SafeReply(tc.subject); got != tc.ok {
			t.Errorf("SafeReply(%q) = %v, want %v", tc.subject, got, tc.ok)
		}
	}
}

// The runner survives a partition's durable consumer being deleted under
// it: it rebuilds the consumer and goes on, and inputs published meanwhile
// land once and in order.
func TestRunnerRebuildsDeletedConsumer(t *testing.T) {
	h := start(t)
	var sent []string
	var name string
	for round := range 3 {
		for range 5 {
			sent = append(sent, h.turn("survivor", schema.RoleUser, 10).ID)
		}
		h.history("survivor", schema.ViewFull, sent[len(sent)-1])
		if ok, why := h.runner.Ready(); !ok {
			t.Fatalf("round %d: not ready before the delete: %s", round, why)
		}
		// "survivor" has no tenant: the shared partition, numbered N.
		name = bus.ConsumerFor("ctxpipe", h.runner.Partitions())
		if err := h.js.DeleteConsumer(context.Background(), bus.StreamIn, name); err != nil {
			t.Fatal(err)
		}
	}
	for range 5 {
		sent = append(sent, h.turn("survivor", schema.RoleUser, 10).ID)
	}
	full := h.history("survivor", schema.ViewFull, sent[len(sent)-1])
	var got []string
	for _, m := range full {
		got = append(got, m.ID)
	}
	if !slices.Equal(got, sent) {
		t.Fatalf("stored %d turns, sent %d: not each once and in order", len(got), len(sent))
	}
	if n := h.metrics.Value("ctxpipe_consumer_rebuilds_total", ""); n < 1 {
		t.Fatalf("rebuilds %v", n)
	}
	cons, err := h.js.Consumer(context.Background(), bus.StreamIn, name)
	if err != nil {
		t.Fatalf("consumer after the deletes: %v", err)
	}
	if cons.CachedInfo().Config.AckPolicy != jetstream.AckExplicitPolicy {
		t.Fatal("rebuilt consumer lost its config")
	}
	// The service rejects as poison at its own count; the server must
	// never stop delivering, or an input whose poison record failed to
	// commit would be lost without a record.
	if md := cons.CachedInfo().Config.MaxDeliver; md != -1 {
		t.Fatalf("max deliver %d on the server, want -1 (unlimited)", md)
	}
}

// Profiles the watch has not delivered are read from the bucket before a
// turn is rejected unknown_profile.
func TestLookupReadsProfilesTheWatchMissed(t *testing.T) {
	ctx := context.Background()
	_, url := natstest.Run(t)
	js, err := jetstream.New(natstest.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := bus.EnsureProfiles(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	ps, err := pipeline.WatchProfiles(watchCtx, kv, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	stopWatch() // the watch sees nothing from now on, as after a broker restart
	time.Sleep(50 * time.Millisecond)
	p := schema.Profile{ID: "late", ContextWindow: 8000, MaxTokens: 100}
	b, _ := schema.Marshal(p)
	if _, err := kv.Put(ctx, "late", b); err != nil {
		t.Fatal(err)
	}
	got, ok, err := ps.Lookup(ctx, "late")
	if err != nil || !ok || got.ContextWindow != 8000 {
		t.Fatalf("Lookup(late) = %+v %v %v", got, ok, err)
	}
	if _, ok, err := ps.Lookup(ctx, "never"); ok || err != nil {
		t.Fatalf("Lookup(never) = %v %v", ok, err)
	}
	ids := ps.IDs()
	sort.Strings(ids)
	if !slices.Contains(ids, "late") {
		t.Fatalf("ids %v", ids)
	}
}

// A wait_for that is waiting when its input commits is answered by the
// commit itself: an applied turn with the history holding it, a rejected
// one with input_rejected, and an id committed in another conversation not
// at all (the wait runs out).
func TestWaitForIsAnsweredByTheCommit(t *testing.T) {
	h := start(t)
	const conv = "waiting"
	h.history(conv, schema.ViewFull, h.turn(conv, schema.RoleUser, 5).ID)
	ask := func(conv, id string, timeout time.Duration) <-chan string {
		out := make(chan string, 1)
		req, _ := json.Marshal(schema.HistoryRequest{ConversationID: conv, WaitFor: id, TimeoutMS: timeout.Milliseconds()})
		go func() {
			msg, err := h.nc.Request(schema.SubjectHistory, req, timeout+5*time.Second)
			if err != nil {
				out <- "request failed: " + err.Error()
				return
			}
			out <- string(msg.Data)
		}()
		return out
	}
	good := schema.Turn{ID: uuid.NewString(), ConversationID: conv, TS: h.nextTS(), Role: schema.RoleAssistant,
		Content: schema.TextContent("the answer")}
	bad := uuid.NewString()
	other := schema.Turn{ID: uuid.NewString(), ConversationID: "elsewhere", TS: h.nextTS(), Role: schema.RoleUser,
		Content: schema.TextContent("not this conversation's")}
	goodReply, badReply, otherReply := ask(conv, good.ID, 10*time.Second), ask(conv, bad, 10*time.Second),
		ask(conv, other.ID, 1500*time.Millisecond)
	time.Sleep(300 * time.Millisecond) // the three are waiting before anything is published

	h.publish(schema.InputSubject(conv, schema.KindTurn), good.ID, good)
	h.publishRaw(schema.InputSubject(conv, schema.KindTurn), bad,
		[]byte(`{"id":"`+bad+`","conversation_id":"`+conv+`","ts":1,"role":"robot","content":"x"}`))
	h.publish(schema.InputSubject(other.ConversationID, schema.KindTurn), other.ID, other)

	var rep schema.HistoryReply
	if data := <-goodReply; schema.DecodeQueryReply([]byte(data), &rep) != nil ||
		len(rep.Messages) != 2 || rep.Messages[1].ID != good.ID {
		t.Fatalf("wait_for an applied turn: %s", data)
	}
	if data := <-badReply; !strings.Contains(data, string(schema.QueryInputRejected)) {
		t.Fatalf("wait_for a rejected turn: %s", data)
	}
	if data := <-otherReply; !strings.Contains(data, `"`+string(schema.QueryTimeout)+`"`) {
		t.Fatalf("wait_for an id committed in another conversation: %s", data)
	}
}

// A payload that stops being JSON after its id is rejected under that id:
// wait_for on it answers input_rejected, and the same broken payload sent
// again (a redelivery, a client retry) is a duplicate, not a second
// rejection.
func TestBrokenPayloadRejectedUnderItsID(t *testing.T) {
	h := start(t)
	const conv = "broken"
	id := uuid.NewString()
	payload := []byte(`{"id":"` + id + `","conversation_id":"` + conv + `","ts":1,"role":"user","content":"never closed`)
	h.publishRaw(schema.InputSubject(conv, schema.KindTurn), id, payload)
	_, qe, _ := h.historyReq(schema.HistoryRequest{ConversationID: conv, WaitFor: id})
	if qe == nil || qe.Code != schema.QueryInputRejected {
		t.Fatalf("wait_for the broken payload's id: %v, want input_rejected", qe)
	}
	// Again, past the stream's duplicate window (another Nats-Msg-Id).
	h.publishRaw(schema.InputSubject(conv, schema.KindTurn), id+"-again", payload)
	ok := schema.Turn{ID: uuid.NewString(), ConversationID: conv, TS: h.nextTS(), Role: schema.RoleUser, Content: schema.TextContent("fine")}
	h.publish(schema.InputSubject(conv, schema.KindTurn), ok.ID, ok)
	h.history(conv, schema.ViewFull, ok.ID)
	var rejections []string
	for _, ev := range h.events(conv) {
		if r, isRej := ev.(*schema.InputRejected); isRej {
			rejections = append(rejections, r.InputID)
		}
	}
	if len(rejections) != 1 || rejections[0] != id {
		t.Fatalf("rejections %v, want one, under %s", rejections, id)
	}
}

// A UUID is the same input id in either case: sent in upper case it is kept
// in lower case, wait_for finds it in either, and the same id in the other
// case with other content is a reused id, not a second input.
func TestInputIDsIgnoreCase(t *testing.T) {
	h := start(t)
	const conv = "cased"
	lower := uuid.NewString()
	upper := strings.ToUpper(lower)
	first := schema.Turn{ID: upper, ConversationID: conv, TS: h.nextTS(), Role: schema.RoleUser, Content: schema.TextContent("first")}
	h.publish(schema.InputSubject(conv, schema.KindTurn), upper, first)
	got := h.history(conv, schema.ViewFull, upper)
	if len(got) != 1 || got[0].ID != lower {
		t.Fatalf("history after the upper-case turn: %+v", got)
	}
	h.history(conv, schema.ViewFull, lower) // wait_for in the other case returns at once
	second := schema.Turn{ID: lower, ConversationID: conv, TS: h.nextTS(), Role: schema.RoleUser, Content: schema.TextContent("second")}
	h.publish(schema.InputSubject(conv, schema.KindTurn), lower+"-msgid", second)
	marker := schema.Turn{ID: uuid.NewString(), ConversationID: conv, TS: h.nextTS(), Role: schema.RoleUser, Content: schema.TextContent("marker")}
	h.publish(schema.InputSubject(conv, schema.KindTurn), marker.ID, marker)
	got = h.history(conv, schema.ViewFull, marker.ID)
	if len(got) != 2 || got[0].Content.Text != "first" || got[1].ID != marker.ID {
		t.Fatalf("the same id in the other case was applied again: %d messages", len(got))
	}
	var reasons []schema.Reason
	for _, ev := range h.events(conv) {
		if r, ok := ev.(*schema.InputRejected); ok {
			reasons = append(reasons, r.Reason)
		}
	}
	if len(reasons) != 1 || reasons[0] != schema.ReasonDuplicateID {
		t.Fatalf("rejections %v, want one %s", reasons, schema.ReasonDuplicateID)
	}
	// A pin names its message in either case too.
	pin := h.control(conv, schema.KindPin, schema.Input{Kind: schema.KindPin, MessageID: strings.ToUpper(marker.ID), Pinned: true})
	if _, qe, _ := h.historyReq(schema.HistoryRequest{ConversationID: conv, WaitFor: pin}); qe != nil {
		t.Fatalf("pin by the upper-case message id: %v", qe)
	}
}

// A purged changelog is not retried in silence, with the instance ready
// while nothing can commit: the append finds the records this store applied gone, /readyz says so, a metric
// counts it, and the input waits in CTX_IN.
func TestPurgedChangelogIsNotReady(t *testing.T) {
	h := start(t)
	first := h.turn("purged", schema.RoleUser, 10)
	h.history("purged", schema.ViewFull, first.ID)
	ctx := context.Background()
	s, err := h.js.Stream(ctx, bus.StreamState)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	h.turn("purged", schema.RoleAssistant, 10)
	deadline := time.Now().Add(20 * time.Second)
	for {
		ok, why := h.runner.Ready()
		if !ok && strings.Contains(why, "changelog lost") {
			t.Logf("not ready after %v: %s", 20*time.Second-time.Until(deadline), why)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still ready (%v: %s) with the changelog purged", ok, why)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := h.metrics.Value("ctxpipe_changelog_lost_total", ""); n < 1 {
		t.Fatalf("lost appends counted %v", n)
	}
}

// A rejection's message quotes what the input held, bounded: a 2.4 MB role
// of U+0085 (quoted and JSON-escaped, 7 bytes for each 2) would make an
// input_rejected event of 8.4 MB, over the message limit, which the relay
// could never publish. The event leaves, and so do the others.
func TestHostileFieldCannotMakeAnEventTooLarge(t *testing.T) {
	h := start(t)
	const conv = "poison"
	id := uuid.NewString()
	payload, err := json.Marshal(map[string]any{"id": id, "conversation_id": conv, "ts": 1,
		"role": strings.Repeat("\u0085", 1_200_000), "content": "x"})
	if err != nil {
		t.Fatal(err)
	}
	h.publishRaw(schema.InputSubject(conv, schema.KindTurn), id, payload)
	if _, qe, _ := h.historyReq(schema.HistoryRequest{ConversationID: conv, WaitFor: id}); qe == nil || qe.Code != schema.QueryInputRejected {
		t.Fatalf("wait_for the hostile turn: %v, want input_rejected", qe)
	}
	var rejected *schema.InputRejected
	for _, ev := range h.events(conv) { // flushes the relay: fails if it is stuck
		if r, ok := ev.(*schema.InputRejected); ok {
			rejected = r
		}
	}
	if rejected == nil || rejected.Reason != schema.ReasonBadRole || len(rejected.Message) > schema.MaxMessageBytes {
		t.Fatalf("rejection %+v", rejected)
	}
	bad := uuid.NewString()
	h.publishRaw(schema.InputSubject("after", schema.KindTurn), bad,
		[]byte(`{"id":"`+bad+`","conversation_id":"after","ts":2,"role":"tool","content":"x"}`))
	if _, qe, _ := h.historyReq(schema.HistoryRequest{ConversationID: "after", WaitFor: bad}); qe == nil {
		t.Fatal("the second bad turn was not rejected")
	}
	if evs := h.events("after"); len(evs) != 1 {
		t.Fatal("no event of another conversation left after the hostile one")
	}
}

// A turn of 4 MiB, the most an input may be, made of U+2028 (3 bytes each):
// written as \u2028 it would take 8 MiB, and no reply holding it would fit the
// message limit, not even a page of one. What an input says does not grow
// when written, so its history reads and a wait for a later input succeeds.
func TestLineSeparatorsDoNotDoubleATurn(t *testing.T) {
	h := start(t, schema.Profile{ID: schema.DefaultProfileID, ContextWindow: 4_000_000, MaxTokens: 1000})
	const conv = "separators"
	big := schema.Turn{ID: uuid.NewString(), ConversationID: conv, TS: h.nextTS(), Role: schema.RoleUser,
		Content: schema.TextContent(strings.Repeat("\u2028", 1_390_000))}
	h.publish(schema.InputSubject(conv, schema.KindTurn), big.ID, big)
	next := schema.Turn{ID: uuid.NewString(), ConversationID: conv, TS: h.nextTS(), Role: schema.RoleAssistant,
		Content: schema.TextContent("ok")}
	h.publish(schema.InputSubject(conv, schema.KindTurn), next.ID, next)
	// Counting 1.4 million characters takes seconds under the race
	// detector: the wait is asked again while it only timed out.
	var full []schema.Message
	for start := time.Now(); ; {
		rep, qe, _ := h.historyReq(schema.HistoryRequest{ConversationID: conv, View: schema.ViewFull, WaitFor: next.ID})
		if qe == nil {
			full = rep.Messages
			break
		}
		if qe.Code != schema.QueryTimeout || time.Since(start) > 2*time.Minute {
			t.Fatalf("history: %s: %s", qe.Code, qe.Message)
		}
	}
	if len(full) != 2 || full[0].Content.Text != big.Content.Text {
		t.Fatalf("history of %d messages", len(full))
	}
}

// One tenant's flood of waits may hold only its share of the queries in
// flight: the others' queries are still answered.
// The bounds are small here: 4 reads and 40 waits, 11 queries per tenant.
func TestOneTenantsWaitFloodLeavesTheOthersRoom(t *testing.T) {
	h := startWith(t, pipeline.Config{Lanes: 4, AckWait: 5 * time.Second, MaxDeliver: 5, RetryBudget: time.Second,
		MaxQueryReads: 4, MaxQueryWaits: 40})
	acme := schema.QuerySubject("acme", schema.VerbHistory)
	sub, err := h.nc.SubscribeSync(h.nc.NewRespInbox() + ".>")
	if err != nil {
		t.Fatal(err)
	}
	inbox := sub.Subject[:len(sub.Subject)-2]
	for i := range 60 {
		req, _ := json.Marshal(schema.HistoryRequest{ConversationID: "busy", WaitFor: uuid.NewString(), TimeoutMS: 30_000})
		if err := h.nc.PublishRequest(acme, fmt.Sprintf("%s.%d", inbox, i), req); err != nil {
			t.Fatal(err)
		}
	}
	refused := 0
	for {
		msg, err := sub.NextMsg(2 * time.Second)
		if err != nil {
			break // the rest are waiting
		}
		if strings.Contains(string(msg.Data), "from this tenant") {
			refused++
		}
	}
	if refused != 60-11 {
		t.Fatalf("%d of acme's 60 waits refused, want %d (its share is 11)", refused, 60-11)
	}
	req, _ := json.Marshal(schema.StatusRequest{ConversationID: "nobody"})
	msg, err := h.nc.Request(schema.QuerySubject("globex", schema.VerbStatus), req, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var qe schema.QueryError
	if json.Unmarshal(msg.Data, &qe) != nil || qe.Error.Code != schema.QueryNotFound {
		t.Fatalf("globex's status with acme's flood pending: %s", msg.Data)
	}
}

// A store that cannot commit (here closed under the runner; in production a
// full disk) makes the instance not ready, saying why, instead of staying
// ready while nothing commits.
func TestStoreThatCannotCommitIsNotReady(t *testing.T) {
	// A short shutdown: the runner ends still holding the input it cannot
	// commit.
	h := startWith(t, pipeline.Config{Lanes: 4, AckWait: 5 * time.Second, MaxDeliver: 5, RetryBudget: time.Second,
		ShutdownTimeout: time.Second})
	first := h.turn("ready", schema.RoleUser, 10)
	h.history("ready", schema.ViewFull, first.ID)
	if ok, why := h.runner.Ready(); !ok {
		t.Fatalf("not ready before: %s", why)
	}
	if err := h.store.Close(); err != nil {
		t.Fatal(err)
	}
	h.turn("ready", schema.RoleAssistant, 10)
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok, why := h.runner.Ready()
		if !ok && strings.Contains(why, "the store cannot commit") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still ready (%v, %q) 10 s after the store stopped committing", ok, why)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
