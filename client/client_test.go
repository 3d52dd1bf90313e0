package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/ctxpipe/ctxpipe/client"
	"github.com/ctxpipe/ctxpipe/client/clienttest"
	"github.com/ctxpipe/ctxpipe/internal/natstest"
	"github.com/ctxpipe/ctxpipe/schema"
)

// newClient starts the real service for t and a client of it on its own
// connection.
func newClient(t *testing.T, opts ...clienttest.Option) (*client.Client, *clienttest.Service, *nats.Conn) {
	t.Helper()
	svc := clienttest.New(t, opts...)
	nc := natstest.Connect(t, svc.URL)
	c, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return c, svc, nc
}

func TestAppendWaitHistoryRoundTrip(t *testing.T) {
	c, _, _ := newClient(t)
	ctx := t.Context()
	const conv = "round-trip"
	result := schema.BlockContent(schema.Block{Type: schema.BlockText, Text: "go.mod\nmain.go"})
	sent := []schema.Turn{
		{ConversationID: conv, Role: schema.RoleUser, Content: schema.TextContent("List the files.")},
		{ID: uuid.NewString(), ConversationID: conv, TS: 1_750_000_000_000, Role: schema.RoleAssistant, AgentID: "coder",
			Content: schema.BlockContent(
				schema.Block{Type: schema.BlockText, Text: "Listing."},
				schema.Block{Type: schema.BlockToolUse, ID: "toolu_1", Name: "bash", Input: json.RawMessage(`{"cmd":"ls"}`)},
			),
			Usage: &schema.Usage{InputTokens: 40, OutputTokens: 12}},
		{ConversationID: conv, TS: 1_750_000_001_000, Role: schema.RoleUser,
			Content: schema.BlockContent(schema.Block{Type: schema.BlockToolResult, ToolUseID: "toolu_1", Content: &result})},
	}
	var ids []string
	for i, tn := range sent {
		id, err := c.Append(ctx, tn)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := uuid.Parse(id); err != nil || (tn.ID != "" && id != tn.ID) {
			t.Fatalf("turn %d: id %q (sent %q)", i, id, tn.ID)
		}
		ids = append(ids, id)
	}
	// Publishing the same turn again is a duplicate, not an error, and not
	// a second message.
	again := sent[1]
	if id, err := c.Append(ctx, again); err != nil || id != again.ID {
		t.Fatalf("re-append: %q %v", id, err)
	}
	if err := c.Wait(ctx, conv, ids[2]); err != nil {
		t.Fatal(err)
	}
	h, err := c.History(ctx, conv, client.View(schema.ViewFull))
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Messages) != 3 || h.ConversationID != conv || h.View != schema.ViewFull {
		t.Fatalf("history: %s with %d messages (%s view)", h.ConversationID, len(h.Messages), h.View)
	}
	for i, m := range h.Messages {
		want := sent[i]
		want.ID = ids[i]
		if want.TS == 0 {
			// Append stamped it: a recent time.
			if d := time.Since(time.UnixMilli(m.TS)); d < 0 || d > time.Minute {
				t.Fatalf("message %d: ts %d is not Append's", i, m.TS)
			}
			want.TS = m.TS
		}
		if !reflect.DeepEqual(m.Turn, want) {
			a, _ := schema.Marshal(m.Turn)
			b, _ := schema.Marshal(want)
			t.Fatalf("message %d came back as\n%s\nwant\n%s", i, a, b)
		}
		if m.Tokens <= 0 {
			t.Fatalf("message %d: %d tokens", i, m.Tokens)
		}
	}
}

func TestHistoryPaging(t *testing.T) {
	c, _, _ := newClient(t)
	ctx := t.Context()
	const conv = "paged"
	appendTurns(ctx, c, conv, 9) // under the threshold: the effective view is all 9
	whole, err := c.History(ctx, conv)
	if err != nil {
		t.Fatal(err)
	}
	paged, err := c.History(ctx, conv, client.PageSize(2))
	if err != nil {
		t.Fatal(err)
	}
	if len(whole.Messages) != 9 || !reflect.DeepEqual(paged.Messages, whole.Messages) || paged.Total != 9 || paged.NextCursor != "" {
		t.Fatalf("paged read %d messages (total %d, next %q), one read %d", len(paged.Messages), paged.Total, paged.NextCursor, len(whole.Messages))
	}
	var sizes []int
	var first string
	for page, err := range c.HistoryPages(ctx, conv, client.PageSize(4)) {
		if err != nil {
			t.Fatal(err)
		}
		if first == "" {
			first = page.NextCursor
		}
		sizes = append(sizes, len(page.Messages))
	}
	if !reflect.DeepEqual(sizes, []int{4, 4, 1}) {
		t.Fatalf("pages of %v", sizes)
	}
	// A condense changes the view: the cursor of the old one is stale.
	id, err := c.Condense(ctx, conv, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Wait(ctx, conv, id); err != nil {
		t.Fatal(err)
	}
	for _, err := range c.HistoryPages(ctx, conv, client.PageSize(4), client.Cursor(first)) {
		var qe *client.QueryError
		if !errors.Is(err, client.ErrStaleCursor) || !errors.As(err, &qe) || qe.Code != schema.QueryBadRequest {
			t.Fatalf("stale cursor: %v", err)
		}
	}
	// History starts again by itself and returns the new view.
	h, err := c.History(ctx, conv, client.PageSize(2))
	if err != nil || len(h.Messages) != 5 || !h.Messages[1].IsSummary {
		t.Fatalf("after the condense: %v %+v", err, h)
	}
}

// A view changed between two pages of one History call: it reads again from
// the start and returns one consistent view, never pages of two.
func TestHistoryRestartsWhenTheViewChanges(t *testing.T) {
	c, _, _ := newClient(t)
	ctx := t.Context()
	const conv = "changing"
	appendTurns(ctx, c, conv, 8)
	done := make(chan error, 1)
	go func() {
		// Turns that cross the threshold again and again, while the main
		// goroutine reads; done once the last is applied.
		var last string
		for i := 8; i < 40; i++ {
			id, err := c.Append(ctx, turn(conv, i))
			if err != nil {
				done <- err
				return
			}
			last = id
		}
		done <- c.Wait(ctx, conv, last)
	}()
	for ctx.Err() == nil {
		h, err := c.History(ctx, conv, client.PageSize(1))
		if err != nil {
			t.Fatal(err)
		}
		// Consistent: the effective view is the first message, at most one
		// summary right after it, and turns in order.
		for i := 1; i < len(h.Messages); i++ {
			if h.Messages[i].IsSummary && i != 1 || h.Messages[i].TS < h.Messages[i-1].TS && !h.Messages[i].IsSummary {
				t.Fatalf("inconsistent view at %d of %d", i, len(h.Messages))
			}
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			return
		default:
		}
	}
}

func TestRejectedInput(t *testing.T) {
	c, _, _ := newClient(t)
	ctx := t.Context()
	const conv = "rejects"
	good := appendTurns(ctx, c, conv, 1)
	bad, err := c.Append(ctx, schema.Turn{ConversationID: conv, Role: "robot", Content: schema.TextContent("beep")})
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, err error) {
		t.Helper()
		var rej *client.RejectedError
		if !errors.As(err, &rej) || !errors.Is(err, client.ErrRejected) {
			t.Fatalf("%s: %v, want a *RejectedError", what, err)
		}
		if rej.InputID != bad || rej.ConversationID != conv || rej.Reason != schema.ReasonBadRole ||
			!strings.Contains(rej.Message, "role") || !strings.Contains(err.Error(), "bad_role") {
			t.Fatalf("%s: %+v", what, rej)
		}
		if errors.Is(err, client.ErrNotFound) || errors.Is(err, client.ErrTimeout) {
			t.Fatalf("%s: %v matches another sentinel", what, err)
		}
	}
	check("Wait", c.Wait(ctx, conv, bad))
	_, err = c.History(ctx, conv, client.WaitFor(bad))
	check("History(WaitFor)", err)
	// The good turn is unaffected.
	if err := c.Wait(ctx, conv, good); err != nil {
		t.Fatal(err)
	}
	// A conversation id that is no subject token is refused before it is
	// published: "a.b" would be tenant a's conversation b.
	for _, conv := range []string{"a.b", "", "_invalid", "x>"} {
		_, err := c.Append(ctx, schema.Turn{ConversationID: conv, Role: schema.RoleUser, Content: schema.TextContent("x")})
		var rej *client.RejectedError
		if !errors.As(err, &rej) || rej.Reason != schema.ReasonBadConversationID {
			t.Fatalf("Append to %q: %v", conv, err)
		}
		if _, err := c.Condense(ctx, conv, ""); !errors.As(err, &rej) {
			t.Fatalf("Condense %q: %v", conv, err)
		}
		if _, err := c.Status(ctx, conv); !errors.Is(err, client.ErrBadRequest) {
			t.Fatalf("Status %q: %v", conv, err)
		}
	}
	if _, err := c.Rewind(ctx, conv, 0, false); !errors.Is(err, client.ErrRejected) {
		t.Fatalf("Rewind to ts 0: %v", err)
	}
	// An id that is not a UUID is refused before it is published: the
	// service could only record the rejection under another id, which
	// Wait could not find.
	for _, id := range []string{"not-a-uuid", strings.Repeat("a", 36), "{" + uuid.NewString() + "}"} {
		_, err := c.Append(ctx, schema.Turn{ID: id, ConversationID: conv, Role: schema.RoleUser, Content: schema.TextContent("x")})
		var rej *client.RejectedError
		if !errors.As(err, &rej) || rej.Reason != schema.ReasonBadID || rej.InputID != id {
			t.Fatalf("Append with id %q: %v", id, err)
		}
	}
	// Waiting for no input would return at once, as if it had landed.
	if err := c.Wait(ctx, conv, ""); !errors.Is(err, client.ErrBadRequest) {
		t.Fatalf("Wait for an empty id: %v", err)
	}
}

func TestNotFound(t *testing.T) {
	c, _, _ := newClient(t)
	ctx := t.Context()
	_, err := c.Status(ctx, "nobody")
	var qe *client.QueryError
	if !errors.As(err, &qe) || qe.Code != schema.QueryNotFound || qe.Verb != schema.VerbStatus || qe.ConversationID != "nobody" || !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("status: %v", err)
	}
	if _, err := c.History(ctx, "nobody", client.View(schema.ViewFull)); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("history: %v", err)
	}
	for _, err := range c.HistoryPages(ctx, "nobody") {
		if !errors.Is(err, client.ErrNotFound) {
			t.Fatalf("history pages: %v", err)
		}
	}
	// A control input for a conversation with no turn is rejected.
	id, err := c.Condense(ctx, "nobody", "")
	if err != nil {
		t.Fatal(err)
	}
	var rej *client.RejectedError
	if err := c.Wait(ctx, "nobody", id); !errors.As(err, &rej) || rej.Reason != schema.ReasonUnknownConversation {
		t.Fatalf("condense of nobody: %v", err)
	}
}

func TestTimeouts(t *testing.T) {
	c, _, nc := newClient(t)
	// A wait for an input that never comes ends with the context's deadline
	// as the service's timeout, not as a hung request.
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := c.Wait(ctx, "nobody", uuid.NewString())
	var qe *client.QueryError
	if !errors.Is(err, client.ErrTimeout) || !errors.As(err, &qe) || qe.Code != schema.QueryTimeout {
		t.Fatalf("wait: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("wait took %v", d)
	}
	// The message says how long the whole wait took, not only the
	// service's last slice of it.
	if !strings.Contains(err.Error(), " in all: ") && !strings.Contains(err.Error(), " after ") {
		t.Fatalf("wait: %q does not say how long it waited in all", err)
	}
	// Without a deadline the client's own timeout bounds it.
	short, err := client.New(nc, client.WithTimeout(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if err := short.Wait(t.Context(), "nobody", uuid.NewString()); !errors.Is(err, client.ErrTimeout) {
		t.Fatalf("wait with the client's timeout: %v", err)
	}
	// A server with no ctxpipe behind it: no responders, at once.
	_, url := natstest.Run(t)
	bare, err := client.New(natstest.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bare.Status(t.Context(), "x"); !errors.Is(err, client.ErrNoService) || !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("status without a service: %v", err)
	}
	// And no CTX_IN stream: the publish fails rather than waiting for ever.
	pctx, pcancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer pcancel()
	if _, err := bare.Append(pctx, schema.Turn{ConversationID: "x", Role: schema.RoleUser, Content: schema.TextContent("x")}); err == nil {
		t.Fatal("append without a stream succeeded")
	}
}

// collect reads s until it has an event of input id whose type is last.
func collect(t *testing.T, s *client.EventStream, id string, last schema.EventType) []schema.Event {
	t.Helper()
	var out []schema.Event
	timer := time.NewTimer(30 * time.Second) // bounds a broken stream only
	defer timer.Stop()
	for {
		select {
		case ev, ok := <-s.C():
			if !ok {
				t.Fatalf("stream ended after %d events: %v", len(out), s.Err())
			}
			out = append(out, ev)
			if h := ev.Header(); h.InputID == id && h.Type == last {
				return out
			}
		case <-timer.C:
			t.Fatalf("no %s event of %s after %d events", last, id, len(out))
		}
	}
}

// stored is the ids of the conversation's events as the service committed
// them, read from its store.
func stored(t *testing.T, svc *clienttest.Service, conv string) []string {
	t.Helper()
	bodies, _, err := svc.Store.EventBodies(t.Context(), conv, 0, 1_000_000)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, len(bodies))
	for i, b := range bodies {
		ev, err := schema.DecodeEvent(b)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = ev.Header().ID
	}
	return out
}

func ids(evs []schema.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.Header().ID
	}
	return out
}

// Streams started before, during and after a run of condenses all deliver
// the conversation's events exactly as committed: none lost, none twice, in
// order.
func TestEventsReplayAndLiveWithoutGapsOrDuplicates(t *testing.T) {
	c, svc, nc := newClient(t)
	ctx := t.Context()
	const conv = "events"
	before, err := c.Events(ctx, conv) // live only, before the conversation exists
	if err != nil {
		t.Fatal(err)
	}
	defer before.Close()
	replayedEarly, err := c.Events(ctx, conv, client.Replay(0)) // replay of nothing, then live
	if err != nil {
		t.Fatal(err)
	}
	defer replayedEarly.Close()
	var mid *client.EventStream
	var last string
	for i := range 40 {
		id, err := c.Append(ctx, turn(conv, i))
		if err != nil {
			t.Fatal(err)
		}
		last = id
		if i == 20 {
			// While inputs are still being applied: some events are stored,
			// some are on their way, some are to come.
			if mid, err = c.Events(ctx, conv, client.Replay(0)); err != nil {
				t.Fatal(err)
			}
			defer mid.Close()
		}
	}
	if err := c.Wait(ctx, conv, last); err != nil {
		t.Fatal(err)
	}
	manual, err := c.Condense(ctx, conv, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Wait(ctx, conv, manual); err != nil {
		t.Fatal(err)
	}
	want := stored(t, svc, conv)
	condenses := 0
	for _, s := range []*client.EventStream{before, replayedEarly, mid} {
		got := collect(t, s, manual, schema.EventCondenseContext)
		if !reflect.DeepEqual(ids(got), want) {
			t.Fatalf("stream delivered %d events, %d are stored:\n%v\n%v", len(got), len(want), ids(got), want)
		}
		condenses = 0
		for _, e := range got {
			if e.Header().Type == schema.EventCondenseContext {
				condenses++
			}
		}
	}
	if condenses < 3 {
		t.Fatalf("only %d condenses: the test did not cross the threshold often", condenses)
	}
	// The relay may publish an event again (a retry after a lost ack): a
	// stream delivers it once all the same. Every stored event is sent
	// again, then a marker; the marker must be next on every stream.
	bodies, _, err := svc.Store.EventBodies(ctx, conv, 0, 1_000_000)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bodies {
		ev, _ := schema.DecodeEvent(b)
		if err := nc.Publish(schema.EventSubject(ev), b); err != nil {
			t.Fatal(err)
		}
	}
	marker := uuid.NewString()
	if err := nc.Publish(schema.EventSubjectPrefix+conv+".marker", []byte(`{"id":"`+marker+`","type":"marker","input_id":"`+marker+`"}`)); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*client.EventStream{before, replayedEarly, mid} {
		if got := collect(t, s, marker, "marker"); len(got) != 1 {
			t.Fatalf("republished events delivered again: %v", ids(got))
		}
	}
	// StoredEvents reads the same, and ends.
	var log []string
	for ev, err := range c.StoredEvents(ctx, conv, 1) {
		if err != nil {
			t.Fatal(err)
		}
		log = append(log, ev.Header().ID)
	}
	if !reflect.DeepEqual(log, want[1:]) {
		t.Fatalf("stored events after 1: %d, want %d", len(log), len(want)-1)
	}
	for _, err := range c.StoredEvents(ctx, "nobody", 0) {
		t.Fatalf("events of nobody: %v", err)
	}
	for _, err := range c.StoredEvents(ctx, "a.b", 0) {
		if !errors.Is(err, client.ErrBadRequest) {
			t.Fatalf("events of a.b: %v", err)
		}
	}
	// Replay from the middle skips the first events.
	s, err := c.Events(ctx, conv, client.Replay(len(want)-2))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := collect(t, s, manual, schema.EventCondenseContext); !reflect.DeepEqual(ids(got), want[len(want)-2:]) {
		t.Fatalf("replay from %d: %v", len(want)-2, ids(got))
	}
}

// With progress, context_managing comes as the condense starts; its
// committed copy is not delivered again.
func TestEventsWithProgressOnce(t *testing.T) {
	started := make(chan struct{}, 8)
	release := make(chan struct{})
	slow := clienttest.WithSummarizer(summarizerFunc(func(ctx context.Context, req schema.SummaryRequest) (schema.Summary, error) {
		started <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
			return schema.Summary{}, ctx.Err()
		}
		return schema.Summary{Text: "summary", Model: "slow", InputTokens: 10, OutputTokens: 5}, nil
	}))
	c, _, _ := newClient(t, slow)
	ctx := t.Context()
	const conv = "progress"
	s, err := c.Events(ctx, conv, client.WithProgress())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	appendTurns(ctx, c, conv, 6)
	id, err := c.Condense(ctx, conv, "")
	if err != nil {
		t.Fatal(err)
	}
	<-started
	// The summarizer is still running: nothing is committed, yet the
	// announcement is there.
	select {
	case ev := <-s.C():
		if ev.Header().Type != schema.EventContextManaging || ev.Header().InputID != id {
			t.Fatalf("first event %s of %s", ev.Header().Type, ev.Header().InputID)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no progress event while the condense runs")
	}
	close(release)
	got := collect(t, s, id, schema.EventCondenseContext)
	if len(got) != 1 {
		t.Fatalf("after the announcement: %d events (%v), want the condense only", len(got), got)
	}
}

type summarizerFunc func(context.Context, schema.SummaryRequest) (schema.Summary, error)

func (f summarizerFunc) Summarize(ctx context.Context, req schema.SummaryRequest) (schema.Summary, error) {
	return f(ctx, req)
}

// An event of a type this client does not know is delivered raw, not
// dropped and not fatal to the stream.
func TestEventsOfUnknownType(t *testing.T) {
	c, _, nc := newClient(t)
	ctx := t.Context()
	s, err := c.Events(ctx, "future")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	id := uuid.NewString()
	data := fmt.Sprintf(`{"id":%q,"type":"from_the_future","conversation_id":"future","ts":1,"input_id":"x","novel":true}`, id)
	if err := nc.Publish(schema.EventSubjectPrefix+"future.from_the_future", []byte(data)); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-s.C():
		raw, ok := ev.(*client.RawEvent)
		if !ok || raw.ID != id || raw.Type != "from_the_future" || string(raw.Data) != data {
			t.Fatalf("got %#v", ev)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no event")
	}
}

// The stream ends when the connection closes, saying so.
func TestEventsEndWithTheConnection(t *testing.T) {
	c, _, nc := newClient(t)
	s, err := c.Events(t.Context(), "x", client.Replay(0))
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
	select {
	case _, ok := <-s.C():
		if ok {
			t.Fatal("an event from nowhere")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("stream still open after the connection closed")
	}
	if !errors.Is(s.Err(), nats.ErrConnectionClosed) {
		t.Fatalf("err %v", s.Err())
	}
}

// A user who may not read the events learns so from Events, not from a
// stream that stays silent.
func TestEventsRefused(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(conf, []byte(`authorization { users = [
		{user: agent, password: pw, permissions: {subscribe: {deny: ["ctx.events.>"]}}}
	] }`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, url := natstest.RunWithConfig(t, conf)
	c, err := client.New(natstest.Connect(t, url, nats.UserInfo("agent", "pw")))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Events(t.Context(), "c1"); !errors.Is(err, nats.ErrPermissionViolation) {
		t.Fatalf("events: %v", err)
	}
}

// A Tracker's view is always what a full read gives: appends come alone,
// anything else as the whole view.
func TestTracker(t *testing.T) {
	c, _, _ := newClient(t)
	ctx := t.Context()
	const conv = "tracked"
	for _, view := range []schema.View{schema.ViewEffective, schema.ViewFull} {
		conv := conv + "-" + string(view)
		tr := c.Track(conv, client.View(view))
		check := func(what string, rep *schema.HistoryReply, err error, reset bool) {
			t.Helper()
			if err != nil {
				t.Fatalf("%s %s: %v", view, what, err)
			}
			full, err := c.History(ctx, conv, client.View(view))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(rep.Messages, full.Messages) || rep.Reset != reset || rep.Seq != full.Seq || rep.Seq == 0 {
				t.Fatalf("%s %s: %d messages (reset %v, seq %d), a full read %d (seq %d)", view, what,
					len(rep.Messages), rep.Reset, rep.Seq, len(full.Messages), full.Seq)
			}
		}
		last := appendTurns(ctx, c, conv, 4)
		rep, err := tr.Read(ctx, last)
		check("first read", rep, err, true)
		rep, err = tr.Read(ctx, "")
		check("unchanged", rep, err, false)
		for i := 4; i < 8; i++ {
			if last, err = c.Append(ctx, turn(conv, i)); err != nil {
				t.Fatal(err)
			}
			rep, err = tr.Read(ctx, last)
			check("append", rep, err, false)
		}
		id, err := c.Condense(ctx, conv, "")
		if err != nil {
			t.Fatal(err)
		}
		rep, err = tr.Read(ctx, id)
		check("condense", rep, err, true)
		if last, err = c.Append(ctx, turn(conv, 8)); err != nil {
			t.Fatal(err)
		}
		rep, err = tr.Read(ctx, last)
		check("append after the condense", rep, err, false)
		if id, err = c.Rewind(ctx, conv, turn(conv, 6).TS, true); err != nil {
			t.Fatal(err)
		}
		rep, err = tr.Read(ctx, id)
		check("rewind", rep, err, true)
		bad, err := c.Append(ctx, schema.Turn{ConversationID: conv, Role: "robot", Content: schema.TextContent("x")})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tr.Read(ctx, bad); !errors.Is(err, client.ErrRejected) {
			t.Fatalf("read after a rejected input: %v", err)
		}
		rep, err = tr.Read(ctx, "")
		check("after the rejection", rep, err, false)
	}
}

// From the service's account, WithTenant reaches one tenant's
// conversations: two tenants' conversations with one id never meet, and
// the plain subjects reach neither.
func TestWithTenant(t *testing.T) {
	svc := clienttest.New(t)
	nc := natstest.Connect(t, svc.URL)
	ctx := t.Context()
	tenants := map[string]*client.Client{}
	for _, name := range []string{"acme", "globex"} {
		c, err := client.New(nc, client.WithTenant(name))
		if err != nil {
			t.Fatal(err)
		}
		tenants[name] = c
	}
	events, err := tenants["acme"].Events(ctx, "c1", client.Replay(0))
	if err != nil {
		t.Fatal(err)
	}
	defer events.Close()
	acme := appendTurns(ctx, tenants["acme"], "c1", 10) // a condense
	appendTurns(ctx, tenants["globex"], "c1", 2)
	for name, want := range map[string]int{"acme": 5, "globex": 2} { // acme's: first, summary, last 3
		h, err := tenants[name].History(ctx, "c1")
		if err != nil || len(h.Messages) != want || h.ConversationID != "c1" {
			t.Fatalf("%s: %v %+v", name, err, h)
		}
		if st, err := tenants[name].Status(ctx, "c1"); err != nil || st.ProfileID != schema.DefaultProfileID {
			t.Fatalf("%s status: %v %+v", name, err, st)
		}
	}
	got := collect(t, events, acme, schema.EventCondenseContext)
	if len(got) != 2 || got[1].Header().ConversationID != "acme.c1" {
		t.Fatalf("acme's events: %d, the last of %q", len(got), got[len(got)-1].Header().ConversationID)
	}
	plain, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Status(ctx, "c1"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("c1 without a tenant: %v", err)
	}
	if _, err := client.New(nc, client.WithTenant("a.b")); err == nil {
		t.Fatal("tenant a.b accepted")
	}
}

// Stored events that do not fit in one ctx.q.events reply (long summaries)
// are replayed in smaller pages, and a history too large for one reply is
// read in pages.
func TestRepliesTooLargeForOneMessage(t *testing.T) {
	summary := strings.Repeat("the agent fixed the failing test; ", 200) // ~6.8 kB
	big := clienttest.WithSummarizer(summarizerFunc(func(ctx context.Context, req schema.SummaryRequest) (schema.Summary, error) {
		return schema.Summary{Text: summary, Model: "long-winded", InputTokens: 10, OutputTokens: 5}, nil
	}))
	wide := clienttest.WithProfiles(schema.Profile{ID: schema.DefaultProfileID, ContextWindow: 1_000_000, MaxTokens: 1000})
	c, svc, _ := newClient(t, big, wide, clienttest.WithMaxPayload(64<<10))
	ctx := t.Context()
	const conv = "wordy"
	long := strings.Repeat("a long tool output line ", 400) // ~9.6 kB
	var condenses []string
	for round := range 12 {
		for i := range 4 {
			role := schema.RoleUser
			if i%2 == 1 {
				role = schema.RoleAssistant
			}
			if _, err := c.Append(ctx, schema.Turn{ConversationID: conv, Role: role, Content: schema.TextContent(fmt.Sprintf("%d.%d %s", round, i, long))}); err != nil {
				t.Fatal(err)
			}
		}
		id, err := c.Condense(ctx, conv, "")
		if err != nil {
			t.Fatal(err)
		}
		condenses = append(condenses, id)
	}
	if err := c.Wait(ctx, conv, condenses[len(condenses)-1]); err != nil {
		t.Fatal(err)
	}
	s, err := c.Events(ctx, conv, client.Replay(0))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got := collect(t, s, condenses[len(condenses)-1], schema.EventCondenseContext)
	if want := stored(t, svc, conv); !reflect.DeepEqual(ids(got), want) {
		t.Fatalf("replayed %d events, %d stored", len(got), len(want))
	}
	n := 0
	for _, e := range got {
		if cc, ok := e.(*schema.CondenseContext); ok && cc.Summary == summary {
			n++
		}
	}
	if n*len(summary) < 64<<10 {
		t.Fatalf("only %d condenses: the events fit in one reply, nothing was tested", n)
	}
	// 48 turns of ~9.6 kB and the summaries: the full view is several
	// replies' worth, so it was read in pages (Total is set then only).
	h, err := c.History(ctx, conv, client.View(schema.ViewFull))
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Messages) != 48+n || h.Total != len(h.Messages) {
		t.Fatalf("full history: %d messages, total %d", len(h.Messages), h.Total)
	}
}

// Pin pins and unpins a stored message (the state records the verdict; a
// pin emits no event), and a message the conversation does not hold is
// rejected unknown_target.
func TestPin(t *testing.T) {
	c, _, _ := newClient(t)
	ctx := t.Context()
	const conv = "pins"
	last := appendTurns(ctx, c, conv, 2)
	if err := c.Wait(ctx, conv, last); err != nil {
		t.Fatal(err)
	}
	for _, pinned := range []bool{true, false} {
		id, err := c.Pin(ctx, conv, last, pinned)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Wait(ctx, conv, id); err != nil {
			t.Fatalf("pin %v: %v", pinned, err)
		}
	}
	id, err := c.Pin(ctx, conv, uuid.NewString(), true)
	if err != nil {
		t.Fatal(err)
	}
	var rej *client.RejectedError
	if err := c.Wait(ctx, conv, id); !errors.As(err, &rej) || rej.Reason != schema.ReasonUnknownTarget {
		t.Fatalf("pin of a message the conversation does not hold: %v", err)
	}
	if _, err := c.Pin(ctx, conv, "", true); !errors.Is(err, client.ErrRejected) {
		t.Fatalf("pin without a message id: %v", err)
	}
}
