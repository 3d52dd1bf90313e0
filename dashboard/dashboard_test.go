package dashboard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/client"
	"github.com/ctxpipe/ctxpipe/dashboard"
	"github.com/ctxpipe/ctxpipe/pipeline"
	"github.com/ctxpipe/ctxpipe/schema"
)

type listReply struct {
	dashboard.Live
	Conversations []dashboard.Row `json:"conversations"`
}

type convReply struct {
	dashboard.Live
	dashboard.Row
	History []dashboard.HistoryItem `json:"history"`
	Events  []json.RawMessage       `json:"events"`
	Series  []dashboard.Point       `json:"series"`
}

func TestPagesAndEmptyState(t *testing.T) {
	e := start(t)
	var list listReply
	if code := e.get("/api/conversations", &list); code != 200 || len(list.Conversations) != 0 || list.NATS != "connected" {
		t.Fatalf("empty list: %d %+v", code, list)
	}
	for path, want := range map[string]string{
		"/":                       "No conversations yet",
		"/c/demo":                 `id="history"`,
		"/static/app.css":         ".gauge",
		"/static/common.js":       "class Live",
		"/static/list.js":         "/api/conversations",
		"/static/conversation.js": "drawPlot",
	} {
		resp, err := e.http.Get(e.srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), want) {
			t.Fatalf("GET %s: %d, want a body with %q", path, resp.StatusCode, want)
		}
		if resp.Header.Get("Content-Security-Policy") == "" {
			t.Fatalf("GET %s: no Content-Security-Policy", path)
		}
	}
	var apiErr map[string]string
	if code := e.get("/api/conversations/nope", &apiErr); code != 404 || !strings.Contains(apiErr["error"], "nope") {
		t.Fatalf("unknown conversation: %d %v", code, apiErr)
	}
	if code := e.get("/api/conversations/a.b.c", &apiErr); code != 400 {
		t.Fatalf("bad key: %d %v", code, apiErr)
	}
}

// The figures the dashboard shows are those the service answers on
// ctx.q.status and ctx.q.history, for the sample session under demo-16k.
func TestConversationMatchesTheService(t *testing.T) {
	e := start(t)
	const conv = "demo"
	e.publish(sampleTurns(t, conv))
	ctx := context.Background()
	st, err := e.cl.Status(ctx, conv)
	if err != nil {
		t.Fatal(err)
	}
	if st.Condensations == 0 || st.HiddenMessages == 0 {
		t.Fatalf("the sample session should have condensed under demo-16k: %+v", st)
	}
	var list listReply
	e.get("/api/conversations", &list)
	if len(list.Conversations) != 1 {
		t.Fatalf("list: %+v", list.Conversations)
	}
	r := list.Conversations[0]
	want := dashboard.Row{Key: conv, ID: conv, Profile: "demo-16k", Tokens: st.ContextTokens, Window: st.ContextWindow,
		Allowed: st.AllowedTokens, Threshold: st.Threshold, ThresholdToken: st.ContextWindow * st.Threshold / 100,
		Percent: st.Percent, Messages: st.Messages, Hidden: st.HiddenMessages, Condenses: st.Condensations,
		Truncations: st.Truncations, UpdatedAt: r.UpdatedAt}
	if r != want || r.Threshold != 60 || r.UpdatedAt == 0 {
		t.Fatalf("row\n%+v\nwant (from ctx.q.status)\n%+v", r, want)
	}

	var c convReply
	if code := e.get("/api/conversations/"+conv, &c); code != 200 {
		t.Fatalf("conversation: %d", code)
	}
	if c.Row != r || len(c.History) != st.Messages {
		t.Fatalf("conversation row %+v, %d messages; list row %+v", c.Row, len(c.History), r)
	}
	// Effective: exactly the messages of the effective history, in order.
	eff, err := e.cl.History(ctx, conv)
	if err != nil {
		t.Fatal(err)
	}
	var effIDs, gotIDs []string
	for _, m := range eff.Messages {
		effIDs = append(effIDs, m.ID)
	}
	byID := map[string]dashboard.HistoryItem{}
	hidden := 0
	for _, it := range c.History {
		byID[it.ID] = it
		if it.Effective {
			gotIDs = append(gotIDs, it.ID)
		}
	}
	if !slices.Equal(gotIDs, effIDs) {
		t.Fatalf("effective messages differ from ctx.q.history's:\n%v\n%v", gotIDs, effIDs)
	}
	// Every hidden message hangs under the summary or marker hiding it.
	for _, it := range c.History {
		if it.HiddenBy == "" {
			continue
		}
		hidden++
		p, ok := byID[it.HiddenBy]
		if !ok || (p.Kind != "summary" && p.Kind != "marker" && p.Kind != "mask") || it.Effective {
			t.Fatalf("message %s hidden by %q (%+v)", it.ID, it.HiddenBy, p)
		}
	}
	if hidden != st.HiddenMessages {
		t.Fatalf("%d messages hidden in the page, %d by ctx.q.status", hidden, st.HiddenMessages)
	}
	// The plot: one point per turn, plus one per reduction (its drop).
	reductions := 0
	for _, p := range c.Series {
		if p.Kind != "" {
			reductions++
		}
	}
	if reductions != st.Condensations+st.Truncations || len(c.Series) != 52+reductions {
		t.Fatalf("series: %d points, %d reductions; status %+v", len(c.Series), reductions, st)
	}
	// The events are the service's, in commit order.
	stream, err := e.cl.Events(ctx, conv, client.Replay(0))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	for i, raw := range c.Events {
		var h schema.EventHeader
		if err := json.Unmarshal(raw, &h); err != nil {
			t.Fatal(err)
		}
		select {
		case ev := <-stream.C():
			if ev.Header().ID != h.ID {
				t.Fatalf("event %d: %s, the service replays %s", i, h.ID, ev.Header().ID)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the service replayed %d events, the page has %d", i, len(c.Events))
		}
	}
	if c.Seq == 0 || c.Mark == 0 {
		t.Fatalf("snapshot position: seq %d mark %d", c.Seq, c.Mark)
	}
}

// Tenants are a column; a control input goes to ctx.in.<tenant>.<conv>; a
// conversation named like a tenant sees none of the tenant's events.
func TestTenants(t *testing.T) {
	e := start(t)
	ctx := context.Background()
	// An agent in tenant acme's account publishes on ctx.in.task.turn; the
	// server maps it to ctx.in.acme.task.turn, which is what arrives here.
	turns := sampleTurns(t, "task")[:12]
	for _, tu := range turns {
		data, err := schema.Marshal(tu)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := bus.PublishInput(ctx, e.js, "ctx.in.acme.task.turn", tu.ID, data); err != nil {
			t.Fatal(err)
		}
	}
	e.publish(sampleTurns(t, "acme")[:12]) // untenanted conversation "acme"
	waitFor(t, func() bool {
		var c convReply
		return e.get("/api/conversations/acme.task", &c) == 200 && c.Messages == 12
	})
	var list listReply
	e.get("/api/conversations", &list)
	got := map[string]string{}
	for _, r := range list.Conversations {
		got[r.Key] = r.Tenant + "|" + r.ID
	}
	if want := map[string]string{"acme": "|acme", "acme.task": "acme|task"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("rows %v, want %v", got, want)
	}
	var snap convReply
	e.get("/api/conversations/acme", &snap)
	plain := e.openSSE(fmt.Sprintf("conv=acme&after=%d", snap.Seq), "")
	all := e.openSSE(fmt.Sprintf("after=%d", snap.Seq), "")

	code, rep := e.post("/api/conversations/acme.task/condense", `{}`, nil)
	if code != http.StatusAccepted || rep["subject"] != "ctx.in.acme.task.condense" {
		t.Fatalf("condense: %d %v", code, rep)
	}
	var cc *schema.CondenseContext
	for cc == nil {
		ev := ctxEvent(t, all.next(t, 15*time.Second, "ctx"))
		if ev.Header().InputID != rep["input_id"] {
			continue
		}
		switch x := ev.(type) {
		case *schema.CondenseContext:
			cc = x
		case *schema.CondenseFailed, *schema.InputRejected:
			t.Fatalf("condense of acme.task: %+v", x)
		}
	}
	if cc.Trigger != schema.TriggerManual || cc.ConversationID != "acme.task" {
		t.Fatalf("condense of acme.task: %+v", cc)
	}
	// The plain conversation's stream saw nothing of it.
	if code, rep := e.post("/api/conversations/acme/condense", `{}`, nil); code != http.StatusAccepted {
		t.Fatalf("condense acme: %d %v", code, rep)
	}
	for {
		ev := ctxEvent(t, plain.next(t, 15*time.Second, "ctx"))
		if ev.Header().ConversationID != "acme" {
			t.Fatalf("conversation acme's stream delivered %s of %s", ev.Header().Type, ev.Header().ConversationID)
		}
		if _, ok := ev.(*schema.CondenseContext); ok {
			break
		}
	}
}

// A browser that reconnects with Last-Event-ID gets what followed that
// event and nothing before it; "changed" tells a page that turns (which
// emit no event) arrived.
func TestEventStreamResumes(t *testing.T) {
	e := start(t)
	const conv = "resume"
	turns := sampleTurns(t, conv)
	e.publish(turns[:30])
	var snap convReply
	e.get("/api/conversations/"+conv, &snap)
	s := e.openSSE(fmt.Sprintf("conv=%s&after=%d&mark=%d", conv, snap.Seq, snap.Mark), "")
	if ev := s.next(t, 15*time.Second, "nats"); !strings.Contains(ev.Data, `"connected"`) {
		t.Fatalf("nats: %s", ev.Data)
	}
	e.publish(turns[30:31])
	s.next(t, 15*time.Second, "changed")

	// Three manual condenses: each gives context_managing and an outcome.
	for range 3 {
		if code, rep := e.post("/api/conversations/"+conv+"/condense", `{"instructions":"keep the test names"}`, nil); code != http.StatusAccepted {
			t.Fatalf("condense: %d %v", code, rep)
		}
	}
	var got []sseEvent
	outcomes := 0
	for outcomes < 3 {
		ev := s.next(t, 15*time.Second, "ctx")
		got = append(got, ev)
		switch ctxEvent(t, ev).(type) {
		case *schema.CondenseContext, *schema.CondenseFailed:
			outcomes++
		}
	}
	s.close()
	for i := 1; i < len(got); i++ {
		a, _ := strconv.ParseUint(got[i-1].ID, 10, 64)
		b, _ := strconv.ParseUint(got[i].ID, 10, 64)
		if a == 0 || b <= a || a <= snap.Seq {
			t.Fatalf("ids %s then %s (snapshot at %d): not increasing stream sequences", got[i-1].ID, got[i].ID, snap.Seq)
		}
	}
	// Reconnect as a browser does after the first event: the same URL
	// (its after= is older) and the last id seen.
	again := e.openSSE(fmt.Sprintf("conv=%s&after=%d&mark=%d", conv, snap.Seq, snap.Mark), got[0].ID)
	for _, want := range got[1:] {
		ev := again.next(t, 15*time.Second, "ctx")
		if ev.ID != want.ID || ev.Data != want.Data {
			t.Fatalf("after reconnecting: %s %s, want %s %s", ev.ID, ev.Data, want.ID, want.Data)
		}
	}
}

// Rewinding from the page brings the messages the condenses hid back; a
// rewind to the first message empties the conversation, which stays listed.
func TestRewind(t *testing.T) {
	e := start(t)
	const conv = "rw"
	turns := sampleTurns(t, conv)
	e.publish(turns)
	var before convReply
	e.get("/api/conversations/"+conv, &before)
	if before.Hidden == 0 {
		t.Fatalf("nothing hidden before the rewind: %+v", before.Row)
	}
	target := turns[5]
	code, rep := e.post("/api/conversations/"+conv+"/rewind", fmt.Sprintf(`{"ts":%d,"include_target":true}`, target.TS), nil)
	if code != http.StatusAccepted {
		t.Fatalf("rewind: %d %v", code, rep)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := e.cl.Wait(ctx, conv, rep["input_id"]); err != nil {
		t.Fatal(err)
	}
	var after convReply
	e.get("/api/conversations/"+conv, &after)
	if after.Messages != 6 || after.Hidden != 0 || after.Condenses != 0 || len(after.History) != 6 {
		t.Fatalf("after the rewind to turn 6: %+v", after.Row)
	}
	for i, it := range after.History {
		if it.ID != turns[i].ID || !it.Effective || it.HiddenBy != "" {
			t.Fatalf("message %d after the rewind: %+v", i, it)
		}
	}
	last := after.Events[len(after.Events)-1]
	if ev, err := schema.DecodeEvent(last); err != nil || ev.Header().Type != schema.EventRewind || ev.(*schema.Rewind).MessagesRestored == 0 {
		t.Fatalf("last event %s (%v)", last, err)
	}

	code, rep = e.post("/api/conversations/"+conv+"/rewind", fmt.Sprintf(`{"ts":%d}`, turns[0].TS), nil)
	if code != http.StatusAccepted {
		t.Fatalf("rewind: %d %v", code, rep)
	}
	if err := e.cl.Wait(ctx, conv, rep["input_id"]); err != nil && !strings.Contains(err.Error(), "not_found") {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		var c convReply
		return e.get("/api/conversations/"+conv, &c) == 200 && len(c.History) == 0 && c.Messages == 0
	})
	var list listReply
	e.get("/api/conversations", &list)
	if len(list.Conversations) != 1 || list.Conversations[0].Messages != 0 {
		t.Fatalf("an emptied conversation stays listed: %+v", list.Conversations)
	}
}

// Control requests are the page's: JSON, same origin, a known conversation,
// a rewind with a ts.
func TestControlGuards(t *testing.T) {
	e := start(t)
	e.publish(sampleTurns(t, "g")[:2])
	for _, c := range []struct {
		name, path, body string
		header           map[string]string
		want             int
	}{
		{"form post", "/api/conversations/g/condense", `{}`, map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 403},
		{"other origin", "/api/conversations/g/condense", `{}`, map[string]string{"Origin": "http://evil.example"}, 403},
		{"unknown conversation", "/api/conversations/nobody/condense", `{}`, nil, 404},
		{"bad key", "/api/conversations/a.b.c/condense", `{}`, nil, 400},
		{"rewind without ts", "/api/conversations/g/rewind", `{}`, nil, 400},
		{"unknown field", "/api/conversations/g/rewind", `{"ts":1,"what":2}`, nil, 400},
		{"a second object after the first", "/api/conversations/g/rewind", `{"ts":5}{"ts":6}`, nil, 400},
		{"instructions too long", "/api/conversations/g/condense", `{"instructions":"` + strings.Repeat("é", schema.MaxInstructionsLen+1) + `"}`, nil, 400},
		{"instructions at the bound", "/api/conversations/g/condense", `{"instructions":"` + strings.Repeat("é", schema.MaxInstructionsLen) + `"}`, nil, 202},
		{"same origin", "/api/conversations/g/condense", `{}`, map[string]string{"Origin": e.srv.URL}, 202},
		// A site that rebound its name to 127.0.0.1 is same-origin with
		// itself; the dashboard does not answer to its name.
		{"rebound name", "/api/conversations/g/condense", `{}`, map[string]string{"Host": "attacker.example:9464", "Origin": "http://attacker.example:9464"}, 421},
		{"rebound name, no origin", "/api/conversations/g/condense", `{}`, map[string]string{"Host": "attacker.example"}, 421},
		{"localhost", "/api/conversations/g/condense", `{}`, map[string]string{"Host": "localhost:9464", "Origin": "http://localhost:9464"}, 202},
		{"IPv6 loopback", "/api/conversations/g/condense", `{}`, map[string]string{"Host": "[::1]:9464", "Origin": "http://[::1]:9464"}, 202},
	} {
		if code, rep := e.post(c.path, c.body, c.header); code != c.want {
			t.Errorf("%s: %d %v, want %d", c.name, code, rep, c.want)
		}
	}
}

// With NATS down the pages still show the store, say NATS is down, and
// refuse to send; once it is back the stream goes on from where it was and
// the buttons work again.
func TestNATSDown(t *testing.T) {
	e := start(t)
	e.publish(sampleTurns(t, "down")[:12])
	var snap convReply
	e.get("/api/conversations/down", &snap)
	s := e.openSSE(fmt.Sprintf("conv=down&after=%d", snap.Seq), "")
	if ev := s.next(t, 15*time.Second, "nats"); !strings.Contains(ev.Data, `"connected"`) {
		t.Fatalf("nats: %s", ev.Data)
	}
	e.px.down()
	if ev := s.next(t, 15*time.Second, "nats"); strings.Contains(ev.Data, `"connected"`) {
		t.Fatalf("nats after the cut: %s", ev.Data)
	}
	var list listReply
	if code := e.get("/api/conversations", &list); code != 200 || len(list.Conversations) != 1 || list.NATS == "connected" {
		t.Fatalf("list with NATS down: %d %+v", code, list)
	}
	var c convReply
	if code := e.get("/api/conversations/down", &c); code != 200 || len(c.History) != 12 || c.NATS == "connected" {
		t.Fatalf("conversation with NATS down: %d %d messages, nats %q", code, len(c.History), c.NATS)
	}
	code, rep := e.post("/api/conversations/down/condense", `{}`, nil)
	if code != http.StatusServiceUnavailable || !strings.Contains(rep["error"], "NATS") {
		t.Fatalf("condense with NATS down: %d %v", code, rep)
	}
	// Meanwhile the service goes on: an agent's condense is applied.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	missed, err := e.cl.Condense(ctx, "down", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.cl.Wait(ctx, "down", missed); err != nil {
		t.Fatal(err)
	}

	e.px.up()
	// Read on until NATS is back, keeping the outcomes that arrive
	// meanwhile (the state may change more than once on the way).
	seen := map[string]bool{}
	outcome := func(ev sseEvent) {
		switch x := ctxEvent(t, ev).(type) {
		case *schema.CondenseContext, *schema.CondenseFailed:
			seen[x.Header().InputID] = true
		}
	}
	for {
		ev := s.next(t, 15*time.Second, "nats", "ctx")
		if ev.Event == "ctx" {
			outcome(ev)
		} else if strings.Contains(ev.Data, `"connected"`) {
			break
		}
	}
	code, rep = e.post("/api/conversations/down/condense", `{}`, nil)
	if code != http.StatusAccepted {
		t.Fatalf("condense with NATS back: %d %v", code, rep)
	}
	// The same stream delivers what was published while it was cut off,
	// and the new condense's outcome.
	for !seen[rep["input_id"]] {
		outcome(s.next(t, 15*time.Second, "ctx"))
	}
	if !seen[missed] {
		t.Fatal("the stream lost the condense applied while the dashboard was cut off")
	}
}

// waitFor polls cond for up to 15 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 15s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Close ends the open event streams, which http.Server's Shutdown would
// otherwise wait for.
func TestCloseEndsStreams(t *testing.T) {
	e := start(t)
	s := e.openSSE("", "")
	s.next(t, 15*time.Second, "nats")
	e.d.Close()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case _, ok := <-s.events:
			if !ok {
				return
			}
		case <-timeout:
			t.Fatal("the event stream is still open after Close")
		}
	}
}

// Reads too answer only to the dashboard's names: a rebound name would
// read every tenant's conversations. A name the operator gives (Hosts)
// is one of them.
func TestUnknownHostsAreRefused(t *testing.T) {
	e := start(t)
	e.publish(sampleTurns(t, "h")[:2])
	get := func(d http.Handler, host string) int {
		req := httptest.NewRequest(http.MethodGet, "/api/conversations", nil)
		req.Host = host
		rec := httptest.NewRecorder()
		d.ServeHTTP(rec, req)
		return rec.Code
	}
	d, err := dashboard.New(dashboard.Deps{Store: e.svc.Store, JS: e.js, Profiles: pipeline.StaticProfiles(demo16k()), Hosts: []string{"ctxpipe.internal"}})
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string]int{
		"127.0.0.1:9464": 200, "localhost": 200, "app.localhost:1": 200, "[::1]:9464": 200, "10.0.0.7:9464": 200,
		"ctxpipe.internal:9464": 200, "CTXPIPE.internal.": 200,
		"attacker.example:9464": 421, "localhost.attacker.example": 421, "": 421, "127.0.0.1.nip.io:9464": 421,
	} {
		if got := get(d, host); got != want {
			t.Errorf("Host %q: %d, want %d", host, got, want)
		}
	}
}

// A page's event stream leaves no consumer behind for long once it is
// closed: a client opening and closing streams in a loop left each one's
// consumer on CTX_EVENTS for the server's default five minutes.
func TestClosedStreamsLeaveNoConsumers(t *testing.T) {
	e := start(t)
	e.publish(sampleTurns(t, "k")[:2])
	stream, err := e.js.Stream(t.Context(), bus.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	consumers := func() int {
		info, err := stream.Info(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Consumers
	}
	base := consumers()
	for range 3 {
		s := e.openSSE("conv=k", "")
		s.next(t, 10*time.Second, "nats") // the stream is up, its consumer made
		s.close()
	}
	deadline := time.Now().Add(15 * time.Second)
	for consumers() > base {
		if time.Now().After(deadline) {
			t.Fatalf("%d consumers on %s 15 s after the streams closed, %d before", consumers(), bus.StreamEvents, base)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
