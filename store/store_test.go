package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/google/uuid"
	sqlite3 "github.com/mattn/go-sqlite3"
)

func openStore(t testing.TB, opts ...Option) *Store {
	t.Helper()
	s, err := Open(context.Background(), filepath.Join(t.TempDir(), "sub", "dir", "ctx.db"), opts...)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func msg(conv, id string, ts int64, role schema.Role, text string) schema.Message {
	return schema.Message{Turn: schema.Turn{ID: id, ConversationID: conv, TS: ts, Role: role,
		Content: schema.TextContent(text)}, Tokens: len(text)}
}

func input(conv string, kind schema.InputKind) InputRecord {
	id := uuid.NewString()
	return InputRecord{ID: id, ConversationID: conv, Kind: string(kind), Subject: schema.InputSubject(conv, kind),
		TS: 1000, Payload: []byte(`{"id":"` + id + `"}`), Status: StatusApplied}
}

// turnEntry is an applied input that appends ms and sets the state.
func turnEntry(conv string, ms ...schema.Message) Entry {
	ch := &schema.Changes{State: schema.ConversationState{ConversationID: conv, Messages: len(ms)}}
	for _, m := range ms {
		ch.Insert = append(ch.Insert, schema.Insertion{Message: m})
	}
	return Entry{Input: input(conv, schema.KindTurn), Changes: ch}
}

func commit(t testing.TB, s *Store, batch ...Entry) []Result {
	t.Helper()
	res, err := s.Commit(context.Background(), batch)
	if err != nil {
		t.Fatalf("Commit: %v", err)
	}
	return res
}

func ids(ms []schema.Message) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	return out
}

func messagesOf(t testing.TB, s *Store, conv string) []schema.Message {
	t.Helper()
	ms, err := s.Messages(context.Background(), conv)
	if err != nil {
		t.Fatalf("Messages(%s): %v", conv, err)
	}
	return ms
}

func TestOpenTwiceAppliesMigrationsOnce(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "a", "ctx.db")
	ms, err := migrations()
	if err != nil || len(ms) < 2 {
		t.Fatalf("embedded migrations: %d, %v", len(ms), err)
	}
	want := ms[len(ms)-1].version
	for i := range 2 {
		s, err := Open(ctx, path)
		if err != nil {
			t.Fatalf("open #%d: %v", i+1, err)
		}
		v, err := s.SchemaVersion(ctx)
		if err != nil || v != want {
			t.Fatalf("open #%d: SchemaVersion = %d, %v; want %d", i+1, v, err, want)
		}
		var rows int
		if err := s.r.QueryRowContext(ctx, "SELECT COUNT(*) FROM schema_version").Scan(&rows); err != nil || rows != len(ms) {
			t.Fatalf("open #%d: schema_version has %d rows (%v), want %d", i+1, rows, err, len(ms))
		}
		var mode string
		if err := s.r.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
			t.Fatalf("open #%d: reader journal_mode = %q (%v), want wal", i+1, mode, err)
		}
		if i == 0 {
			commit(t, s, turnEntry("c1", msg("c1", "m1", 1, schema.RoleUser, "hi")))
		}
		if got := ids(messagesOf(t, s, "c1")); !reflect.DeepEqual(got, []string{"m1"}) {
			t.Fatalf("open #%d: messages = %v", i+1, got)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("close #%d: %v", i+1, err)
		}
	}
}

func TestReaderPoolIsReadOnly(t *testing.T) {
	s := openStore(t)
	_, err := s.r.ExecContext(context.Background(), "INSERT INTO conversations (id, state, updated_at) VALUES ('x', '{}', 0)")
	if err == nil {
		t.Fatal("insert through the read pool succeeded; want a read-only error")
	}
}

// A tool_use input must come back byte for byte: key order, <>& and escapes
// as the agent sent them, since token counts were taken from those bytes.
func TestCommitPreservesToolUseInputBytes(t *testing.T) {
	const toolInput = `{"zeta":1,"path":"a<b>&c.go","alpha":[true,null],"esc":"\u00e9\n","é":"ü"}`
	raw := `{"id":"` + uuid.NewString() + `","conversation_id":"c1","ts":5,"role":"assistant","content":[` +
		`{"type":"text","text":"if a < b && c > d {"},` +
		`{"type":"tool_use","id":"tu1","name":"edit","input":` + toolInput + `}],"usage":{"input_tokens":10,"output_tokens":2}}`
	var turn schema.Turn
	if err := json.Unmarshal([]byte(raw), &turn); err != nil {
		t.Fatal(err)
	}
	m := schema.Message{Turn: turn, Tokens: 42}
	s := openStore(t)
	commit(t, s, turnEntry("c1", m))
	got := messagesOf(t, s, "c1")
	if len(got) != 1 {
		t.Fatalf("got %d messages", len(got))
	}
	if in := string(got[0].Content.Blocks[1].Input); in != toolInput {
		t.Errorf("tool input bytes changed:\n got %s\nwant %s", in, toolInput)
	}
	if !reflect.DeepEqual(got[0], m) {
		t.Errorf("message changed in the round trip:\n got %+v\nwant %+v", got[0], m)
	}
	if got[0].Usage == nil || got[0].Usage.InputTokens != 10 {
		t.Errorf("usage lost: %+v", got[0].Usage)
	}
}

func TestInsertOrdering(t *testing.T) {
	ins := func(id, before string) schema.Insertion {
		return schema.Insertion{Message: msg("c", id, 1, schema.RoleUser, id), Before: before}
	}
	tests := []struct {
		name    string
		initial []string
		inserts []schema.Insertion
		want    []string
	}{
		{"append to empty", nil, []schema.Insertion{ins("a", ""), ins("b", "")}, []string{"a", "b"}},
		{"append after existing", []string{"a", "b"}, []schema.Insertion{ins("c", "")}, []string{"a", "b", "c"}},
		{"before a middle message", []string{"a", "b", "c"}, []schema.Insertion{ins("x", "b")}, []string{"a", "x", "b", "c"}},
		{"several before the same id keep their order", []string{"a", "b", "c"},
			[]schema.Insertion{ins("x", "c"), ins("y", "c"), ins("z", "c")}, []string{"a", "b", "x", "y", "z", "c"}},
		{"before the first message", []string{"a", "b"}, []schema.Insertion{ins("s", "a")}, []string{"s", "a", "b"}},
		{"several before the first message", []string{"a"}, []schema.Insertion{ins("s1", "a"), ins("s2", "a")}, []string{"s1", "s2", "a"}},
		{"chain through earlier inserts of the same changes", []string{"a", "b"},
			[]schema.Insertion{ins("x", "b"), ins("y", "x"), ins("z", "y"), ins("w", "")}, []string{"a", "z", "y", "x", "b", "w"}},
		{"insert before a message appended in the same changes", nil,
			[]schema.Insertion{ins("a", ""), ins("b", ""), ins("m", "b")}, []string{"a", "m", "b"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := openStore(t)
			if len(tc.initial) > 0 {
				var ms []schema.Message
				for _, id := range tc.initial {
					ms = append(ms, msg("c", id, 1, schema.RoleUser, id))
				}
				commit(t, s, turnEntry("c", ms...))
			}
			e := turnEntry("c")
			e.Changes.Insert = tc.inserts
			commit(t, s, e)
			if got := ids(messagesOf(t, s, "c")); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("order = %v, want %v", got, tc.want)
			}
		})
	}
}

// Halving the gap before one message runs out of float64 precision after
// about 50 inserts; the store renumbers and keeps going, order intact.
func TestInsertBeforeSameMessageManyTimes(t *testing.T) {
	s := openStore(t)
	commit(t, s, turnEntry("c", msg("c", "first", 1, schema.RoleUser, "f"), msg("c", "last", 2, schema.RoleUser, "l")))
	want := []string{"first"}
	for i := range 120 {
		id := fmt.Sprintf("i%03d", i)
		e := turnEntry("c")
		e.Changes.Insert = []schema.Insertion{{Message: msg("c", id, 1, schema.RoleUser, id), Before: "last"}}
		commit(t, s, e)
		want = append(want, id)
	}
	want = append(want, "last")
	if got := ids(messagesOf(t, s, "c")); !reflect.DeepEqual(got, want) {
		t.Fatalf("order = %v\nwant %v", got, want)
	}
}

func TestTagChanges(t *testing.T) {
	s := openStore(t)
	commit(t, s, turnEntry("c", msg("c", "a", 1, schema.RoleUser, "a"), msg("c", "b", 2, schema.RoleAssistant, "b")))
	// A condense: the summary goes in with its own tags, a and b get hidden.
	summary := msg("c", "sum", 3, schema.RoleAssistant, "summary")
	summary.IsSummary, summary.CondenseID = true, "cond-1"
	e := turnEntry("c")
	e.Changes.Insert = []schema.Insertion{{Message: summary}}
	e.Changes.Tags = []schema.TagChange{
		{MessageID: "a", Field: schema.TagCondenseParent, Value: "cond-1"},
		{MessageID: "b", Field: schema.TagCondenseParent, Value: "cond-1"},
		{MessageID: "b", Field: schema.TagTruncationParent, Value: "trunc-1"},
	}
	commit(t, s, e)
	got := messagesOf(t, s, "c")
	if got[0].CondenseParent != "cond-1" || got[1].CondenseParent != "cond-1" || got[1].TruncationParent != "trunc-1" {
		t.Fatalf("tags not set: %+v", got)
	}
	if !got[2].IsSummary || got[2].CondenseID != "cond-1" || got[2].Tokens != len("summary") {
		t.Fatalf("summary tags lost: %+v", got[2])
	}
	// The stored body never carries the mutable tags: the columns are the truth.
	var body string
	if err := s.r.QueryRow("SELECT body FROM messages WHERE id = 'a'").Scan(&body); err != nil || strings.Contains(body, "cond-1") {
		t.Fatalf("body of a = %s (%v); want no parent tag in it", body, err)
	}
	e = turnEntry("c")
	e.Changes.Tags = []schema.TagChange{{MessageID: "b", Field: schema.TagCondenseParent, Value: ""}}
	commit(t, s, e)
	got = messagesOf(t, s, "c")
	if got[0].CondenseParent != "cond-1" || got[1].CondenseParent != "" || got[1].TruncationParent != "trunc-1" {
		t.Fatalf("after clearing b's condense_parent: %+v", got)
	}

	bad := []struct {
		name string
		tag  schema.TagChange
	}{
		{"missing message", schema.TagChange{MessageID: "nope", Field: schema.TagCondenseParent, Value: "x"}},
		{"unknown field", schema.TagChange{MessageID: "a", Field: "is_summary", Value: "x"}},
	}
	for _, tc := range bad {
		e := turnEntry("c")
		e.Changes.Tags = []schema.TagChange{tc.tag}
		if _, err := s.Commit(context.Background(), []Entry{e}); err == nil {
			t.Errorf("%s: Commit succeeded, want an error", tc.name)
		}
	}
}

func TestBatchDuplicateSkipsOnlyThatEntry(t *testing.T) {
	s := openStore(t)
	first := turnEntry("c", msg("c", "m1", 1, schema.RoleUser, "one"))
	commit(t, s, first)

	again := first // redelivered after the dedup window, different changes must not apply
	again.Changes = &schema.Changes{Insert: []schema.Insertion{{Message: msg("c", "zzz", 9, schema.RoleUser, "dup")}}}
	second := turnEntry("c", msg("c", "m2", 2, schema.RoleAssistant, "two"))
	third := turnEntry("d", msg("d", "m3", 3, schema.RoleUser, "three"))
	sameInBatch := third
	sameInBatch.Changes = &schema.Changes{Insert: []schema.Insertion{{Message: msg("d", "yyy", 9, schema.RoleUser, "dup")}}}

	res := commit(t, s, second, again, third, sameInBatch)
	want := []Result{{InputID: second.Input.ID}, {InputID: first.Input.ID, Duplicate: true},
		{InputID: third.Input.ID}, {InputID: third.Input.ID, Duplicate: true}}
	if !reflect.DeepEqual(res, want) {
		t.Fatalf("results = %+v, want %+v", res, want)
	}
	if got := ids(messagesOf(t, s, "c")); !reflect.DeepEqual(got, []string{"m1", "m2"}) {
		t.Errorf("c = %v", got)
	}
	if got := ids(messagesOf(t, s, "d")); !reflect.DeepEqual(got, []string{"m3"}) {
		t.Errorf("d = %v", got)
	}
}

func TestFailedBatchCommitsNothing(t *testing.T) {
	ctx := context.Background()
	bad := func(conv string) Entry {
		e := turnEntry(conv)
		e.Changes.Insert = []schema.Insertion{{Message: msg(conv, "x", 1, schema.RoleUser, "x"), Before: "missing"}}
		return e
	}
	dupMsg := func(conv string) Entry { return turnEntry(conv, msg(conv, "m1", 1, schema.RoleUser, "again")) }
	noID := turnEntry("c")
	noID.Input.ID = ""
	badEventConv := turnEntry("c")
	badEventConv.Changes.Events = []schema.Event{&schema.InputRejected{EventHeader: schema.EventHeader{
		ID: uuid.NewString(), Type: schema.EventInputRejected, ConversationID: "a.b.c"}}}
	stateOtherConv := turnEntry("c")
	stateOtherConv.Changes.State.ConversationID = "other"

	tests := []struct {
		name    string
		bad     Entry
		wantIdx int
	}{
		{"before names a missing message", bad("c"), 1},
		{"message id already stored", dupMsg("c"), 1},
		{"empty input id", noID, 1},
		{"event conversation id not a conversation key", badEventConv, 1},
		{"state for another conversation", stateOtherConv, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := openStore(t)
			base := turnEntry("c", msg("c", "m1", 1, schema.RoleUser, "base"))
			commit(t, s, base)
			good1 := turnEntry("c", msg("c", "g1", 2, schema.RoleAssistant, "g1"))
			good1.Changes.Events = []schema.Event{&schema.ContextManaging{EventHeader: schema.EventHeader{
				ID: uuid.NewString(), Type: schema.EventContextManaging, ConversationID: "c", InputID: good1.Input.ID}}}
			good2 := turnEntry("e", msg("e", "g2", 3, schema.RoleUser, "g2"))
			_, err := s.Commit(ctx, []Entry{good1, tc.bad, good2})
			var ee *EntryError
			if !errors.As(err, &ee) || ee.Index != tc.wantIdx {
				t.Fatalf("Commit error = %v; want an *EntryError for entry %d", err, tc.wantIdx)
			}
			if isBusy(err) {
				t.Errorf("isBusy(%v) = true", err)
			}
			if got := ids(messagesOf(t, s, "c")); !reflect.DeepEqual(got, []string{"m1"}) {
				t.Errorf("c = %v, want only m1", got)
			}
			if got := messagesOf(t, s, "e"); len(got) != 0 {
				t.Errorf("e = %v, want nothing", ids(got))
			}
			for _, id := range []string{good1.Input.ID, good2.Input.ID} {
				if _, _, found, err := s.InputStatus(ctx, id); err != nil || found {
					t.Errorf("input %s stored (%v) after a failed batch", id, err)
				}
			}
			if n, err := s.Pending(ctx); err != nil || n != 0 {
				t.Errorf("Pending = %d, %v; want 0", n, err)
			}
			// The same good entries commit fine on their own afterwards.
			if res := commit(t, s, good1, good2); res[0].Duplicate || res[1].Duplicate {
				t.Errorf("retry without the bad entry: %+v", res)
			}
		})
	}
}

func TestStateUpsertAndRejection(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	if _, found, err := s.State(ctx, "c"); err != nil || found {
		t.Fatalf("State of a new conversation: found=%v err=%v", found, err)
	}
	e := turnEntry("c", msg("c", "m1", 1, schema.RoleUser, "one"))
	e.Changes.State = schema.ConversationState{ConversationID: "c", ProfileID: "p", ContextTokens: 10, Messages: 1,
		LastToolUseIDs: []string{"tu1"}, LastTS: 1}
	commit(t, s, e)
	e2 := turnEntry("c", msg("c", "m2", 2, schema.RoleAssistant, "two"))
	want := schema.ConversationState{ConversationID: "c", ProfileID: "p", ContextTokens: 25, Messages: 2,
		CondenseBlocked: true, Condensations: 1, LastTS: 2}
	e2.Changes.State = want
	commit(t, s, e2)

	// A rejection: recorded, announced, and the state left alone.
	rej := input("c", schema.KindTurn)
	rej.Status, rej.Reason, rej.Payload = StatusRejected, string(schema.ReasonBadRole), []byte(`{"role":"system"}`)
	ev := &schema.InputRejected{EventHeader: schema.EventHeader{ID: uuid.NewString(), Type: schema.EventInputRejected,
		ConversationID: "c", TS: 7, InputID: rej.ID}, Reason: schema.ReasonBadRole, Message: "bad role", Subject: rej.Subject}
	res := commit(t, s, Entry{Input: rej, Changes: &schema.Changes{Events: []schema.Event{ev}}})
	if res[0].Duplicate {
		t.Fatal("rejection reported as duplicate")
	}
	// Recording only, without changes, is allowed too.
	bare := input("c", schema.KindOverflow)
	bare.Status, bare.Reason = StatusRejected, string(schema.ReasonBadTS)
	commit(t, s, Entry{Input: bare})

	got, found, err := s.State(ctx, "c")
	if err != nil || !found || !reflect.DeepEqual(got, want) {
		t.Fatalf("State = %+v, %v, %v; want %+v", got, found, err, want)
	}
	status, reason, found, err := s.InputStatus(ctx, rej.ID)
	if err != nil || !found || status != StatusRejected || reason != string(schema.ReasonBadRole) {
		t.Fatalf("InputStatus(rejected) = %q %q %v %v", status, reason, found, err)
	}
	if status, _, found, _ := s.InputStatus(ctx, e.Input.ID); !found || status != StatusApplied {
		t.Fatalf("InputStatus(applied) = %q %v", status, found)
	}
	var payload []byte
	if err := s.r.QueryRow("SELECT payload FROM inputs WHERE id = ?", rej.ID).Scan(&payload); err != nil || string(payload) != `{"role":"system"}` {
		t.Fatalf("rejected payload = %q, %v", payload, err)
	}
	evs, err := s.Events(ctx, "c")
	if err != nil || len(evs) != 1 || !reflect.DeepEqual(evs[0], schema.Event(ev)) {
		t.Fatalf("Events = %+v, %v; want the rejection", evs, err)
	}
	if n, _ := s.Pending(ctx); n != 1 {
		t.Fatalf("Pending = %d, want 1", n)
	}
	convs, err := s.Conversations(ctx)
	if err != nil || !reflect.DeepEqual(convs, []string{"c"}) {
		t.Fatalf("Conversations = %v, %v", convs, err)
	}
	if n, err := s.ConversationCount(ctx); err != nil || n != 1 {
		t.Fatalf("ConversationCount = %d, %v", n, err)
	}
}

func TestEventsIdempotentAndContextEvents(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	hdr := func(typ schema.EventType, ts int64) schema.EventHeader {
		return schema.EventHeader{ID: uuid.NewString(), Type: typ, ConversationID: "c", TS: ts, InputID: "in"}
	}
	trunc := &schema.SlidingWindowTruncation{EventHeader: hdr(schema.EventSlidingWindowTruncation, 300), TruncationID: "t1", MessagesRemoved: 2}
	cond := &schema.CondenseContext{EventHeader: hdr(schema.EventCondenseContext, 100), CondenseID: "k1", Summary: "s <b>", Trigger: schema.TriggerAuto}
	fail := &schema.CondenseFailed{EventHeader: hdr(schema.EventCondenseFailed, 200), Error: schema.ReasonContextGrew}
	e := turnEntry("c")
	e.Changes.Events = []schema.Event{trunc, cond, fail}
	commit(t, s, e)
	// The same event ids again under another input: stored once, sent once.
	e2 := turnEntry("c")
	e2.Changes.Events = []schema.Event{cond}
	commit(t, s, e2)

	refs, err := s.ContextEvents(ctx, "c")
	want := []schema.ContextEventRef{{Type: schema.EventCondenseContext, ID: "k1", TS: 100},
		{Type: schema.EventSlidingWindowTruncation, ID: "t1", TS: 300}}
	if err != nil || !reflect.DeepEqual(refs, want) {
		t.Fatalf("ContextEvents = %+v, %v; want %+v", refs, err, want)
	}
	evs, err := s.Events(ctx, "c")
	if err != nil || !reflect.DeepEqual(evs, []schema.Event{trunc, cond, fail}) {
		t.Fatalf("Events = %+v, %v", evs, err)
	}
	if n, _ := s.Pending(ctx); n != 3 {
		t.Fatalf("Pending = %d, want 3", n)
	}
	var subj string
	if err := s.r.QueryRow("SELECT subject FROM outbox WHERE event_id = ?", cond.ID).Scan(&subj); err != nil || subj != "ctx.events.c.condense_context" {
		t.Fatalf("outbox subject = %q, %v", subj, err)
	}
}

// A rewind deletes messages; the inputs that created them stay.
func TestRewindDeletesMessagesKeepsInputs(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	e1 := turnEntry("c", msg("c", "a", 1, schema.RoleUser, "a"))
	e2 := turnEntry("c", msg("c", "b", 2, schema.RoleAssistant, "b"), msg("c", "c", 3, schema.RoleUser, "c"))
	commit(t, s, e1, e2)
	rw := turnEntry("c")
	rw.Input.Kind = string(schema.KindRewind)
	// Deletes run first, so a message inserted in the same changes may go
	// where a deleted one was (and a missing id is no error).
	rw.Changes.Delete = []string{"b", "c", "never-existed"}
	rw.Changes.Insert = []schema.Insertion{{Message: msg("c", "d", 4, schema.RoleUser, "d")}}
	rw.Changes.Tags = []schema.TagChange{{MessageID: "a", Field: schema.TagTruncationParent, Value: ""}}
	commit(t, s, rw)
	if got := ids(messagesOf(t, s, "c")); !reflect.DeepEqual(got, []string{"a", "d"}) {
		t.Fatalf("after rewind = %v", got)
	}
	if _, _, found, err := s.InputStatus(ctx, e2.Input.ID); err != nil || !found {
		t.Fatalf("input of deleted messages gone: %v %v", found, err)
	}
}

func TestDurableAcrossReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ctx.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	var batch []Entry
	for i := range 20 {
		conv := fmt.Sprintf("c%d", i%3)
		e := turnEntry(conv, msg(conv, fmt.Sprintf("m%02d", i), int64(i), schema.RoleUser, fmt.Sprint(i)))
		e.Changes.State.LastTS = int64(i)
		e.Changes.Events = []schema.Event{&schema.ContextManaging{EventHeader: schema.EventHeader{
			ID: uuid.NewString(), Type: schema.EventContextManaging, ConversationID: conv, TS: int64(i)}}}
		batch = append(batch, e)
	}
	commit(t, s, batch...)
	before := map[string][]schema.Message{}
	for _, c := range []string{"c0", "c1", "c2"} {
		before[c] = messagesOf(t, s, c)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(ctx, batch); !errors.Is(err, ErrClosed) {
		t.Fatalf("Commit after Close = %v, want ErrClosed", err)
	}
	s, err = Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for c, want := range before {
		if got := messagesOf(t, s, c); !reflect.DeepEqual(got, want) || len(got) == 0 {
			t.Errorf("%s after reopen = %v, want %v", c, ids(got), ids(want))
		}
	}
	if st, found, err := s.State(ctx, "c1"); err != nil || !found || st.LastTS != 19 {
		t.Errorf("state of c1 after reopen = %+v %v %v", st, found, err)
	}
	if n, _ := s.Pending(ctx); n != 20 {
		t.Errorf("Pending after reopen = %d, want 20", n)
	}
	for _, r := range commit(t, s, batch...) {
		if !r.Duplicate {
			t.Fatalf("entry %s not a duplicate after reopen", r.InputID)
		}
	}
}

// SQLITE_BUSY from a lock held by another connection is worth a retry.
func TestBusyIsRetryable(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, WithBusyTimeout(time.Millisecond))
	other, err := sql.Open("sqlite3", "file:"+s.Path()+"?_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	tx, err := other.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Commit(ctx, []Entry{turnEntry("c", msg("c", "m", 1, schema.RoleUser, "m"))})
	tx.Rollback()
	if err == nil || !isBusy(err) {
		t.Fatalf("Commit under another writer's lock = %v; want a transient error", err)
	}
	if isBusy(errors.New("other")) || isBusy(nil) {
		t.Fatal("IsTransient true for a plain error")
	}
	commit(t, s, turnEntry("c", msg("c", "m", 1, schema.RoleUser, "m"))) // works once the lock is gone
}

// Readers never see a half-applied batch and never block the writer.
func TestConcurrentReadersAndWriter(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	const batches, perBatch = 40, 5
	done := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for r := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			last := 0
			for {
				select {
				case <-done:
					return
				default:
				}
				snap, err := s.Load(ctx, "c")
				if err != nil {
					errs <- err
					return
				}
				n := len(snap.Messages)
				// Whole batches only, never fewer than before, and the state
				// matches the history it was committed with.
				if n%perBatch != 0 || n < last || (snap.Found && snap.State.Messages != n) {
					errs <- fmt.Errorf("reader %d: %d messages (last %d), state says %d", r, n, last, snap.State.Messages)
					return
				}
				for i, m := range snap.Messages {
					if m.TS != int64(i) {
						errs <- fmt.Errorf("reader %d: message %d has ts %d", r, i, m.TS)
						return
					}
				}
				last = n
			}
		}()
	}
	for b := range batches {
		var entries []Entry
		for i := range perBatch {
			n := b*perBatch + i
			e := turnEntry("c", msg("c", fmt.Sprintf("m%04d", n), int64(n), schema.RoleUser, "x"))
			e.Changes.State.Messages = n + 1
			entries = append(entries, e)
		}
		commit(t, s, entries...)
	}
	close(done)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := messagesOf(t, s, "c"); len(got) != batches*perBatch {
		t.Fatalf("%d messages, want %d", len(got), batches*perBatch)
	}
}

// BenchmarkCommitBatch measures what grouping buys with synchronous=FULL:
// each entry is one appended turn with its state, as a plain turn commits.
func BenchmarkCommitBatch(b *testing.B) {
	for _, size := range []int{1, 16, 128} {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			s := openStore(b)
			ctx := context.Background()
			text := strings.Repeat("some words of a turn ", 40)
			n := 0
			b.ResetTimer()
			for b.Loop() {
				batch := make([]Entry, size)
				for i := range batch {
					conv := fmt.Sprintf("c%d", n%8)
					batch[i] = turnEntry(conv, msg(conv, uuid.NewString(), int64(n), schema.RoleUser, text))
					n++
				}
				if _, err := s.Commit(ctx, batch); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "entries/s")
		})
	}
}

// Within one batch: the newest state per conversation wins, appends after a
// renumber or a delete still land last.
func TestBatchStateAndPositionsAcrossEntries(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	first := turnEntry("c", msg("c", "a", 1, schema.RoleUser, "a"), msg("c", "b", 2, schema.RoleUser, "b"))
	first.Changes.State.LastTS = 1
	var many []schema.Insertion
	var want []string
	want = append(want, "a")
	for i := range 70 { // forces a renumber inside the transaction
		id := fmt.Sprintf("x%02d", i)
		many = append(many, schema.Insertion{Message: msg("c", id, 1, schema.RoleUser, id), Before: "b"})
		want = append(want, id)
	}
	middle := turnEntry("c")
	middle.Changes.Insert = many
	middle.Changes.State.LastTS = 2
	other := turnEntry("d", msg("d", "d1", 1, schema.RoleUser, "d1"))
	other.Changes.State.LastTS = 7
	rewind := turnEntry("c", msg("c", "c", 3, schema.RoleUser, "c"))
	rewind.Changes.Delete = []string{"b"}
	rewind.Changes.State.LastTS = 3
	last := turnEntry("c", msg("c", "e", 4, schema.RoleUser, "e"))
	last.Changes.State.LastTS = 4
	dup := last // a duplicate's state must not be written
	dup.Changes = &schema.Changes{State: schema.ConversationState{ConversationID: "c", LastTS: 99}}
	commit(t, s, first, middle, other, rewind, last, dup)
	want = append(want, "c", "e")
	if got := ids(messagesOf(t, s, "c")); !reflect.DeepEqual(got, want) {
		t.Fatalf("order = %v\nwant %v", got, want)
	}
	for conv, ts := range map[string]int64{"c": 4, "d": 7} {
		if st, found, err := s.State(ctx, conv); err != nil || !found || st.LastTS != ts {
			t.Errorf("state of %s = %+v, %v, %v; want LastTS %d", conv, st, found, err, ts)
		}
	}
}

// isBusy tells an error worth retrying unchanged: SQLite said the database
// was busy or locked (another connection holds it).
func isBusy(err error) bool {
	var se sqlite3.Error
	if errors.As(err, &se) {
		return se.Code == sqlite3.ErrBusy || se.Code == sqlite3.ErrLocked
	}
	return false
}
