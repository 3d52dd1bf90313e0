package store

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/google/uuid"

	"github.com/ctxpipe/ctxpipe/schema"
)

// The recent index answers an incremental read exactly as SQLite does, or
// not at all: over random histories of appends (with tool calls and
// results), resets of every kind (a summary hiding messages, a rewind, an
// insertion before a message, a control input), appends replayed from the
// changelog, and several conversations in one commit, every read after every
// sequence is compared with the read from SQLite.
func TestRecentAnswersAsSQLiteDoes(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	rng := rand.New(rand.NewPCG(7, 11))
	convs := []string{"ra", "rb", "rc"}
	stored := map[string][]string{}
	ts := int64(1000)
	next := func(conv string, role schema.Role, toolResult bool) schema.Message {
		ts++
		m := msg(conv, uuid.NewString(), ts, role, fmt.Sprintf("turn %d of %s", ts, conv))
		switch {
		case toolResult:
			m.Role = schema.RoleUser
			m.Content = schema.Content{IsBlocks: true, Blocks: []schema.Block{{Type: schema.BlockToolResult, ToolUseID: "call-" + conv,
				Content: &schema.Content{Text: "ok"}}}}
		case role == schema.RoleAssistant && rng.IntN(2) == 0:
			m.Content = schema.Content{IsBlocks: true, Blocks: []schema.Block{{Type: schema.BlockToolUse, ID: "call-" + conv,
				Name: "bash", Input: json.RawMessage(`{"command":"ls"}`)}}}
		}
		stored[conv] = append(stored[conv], m.ID)
		return m
	}
	entryFor := func(conv string) Entry {
		switch k := rng.IntN(12); {
		case k < 7: // a turn, one or two messages
			ms := []schema.Message{next(conv, schema.RoleAssistant, false)}
			if rng.IntN(3) == 0 {
				ms = append(ms, next(conv, schema.RoleUser, true))
			}
			return turnEntry(conv, ms...)
		case k == 7 && len(stored[conv]) > 2: // a summary hiding the first messages
			sum := next(conv, schema.RoleUser, false)
			sum.IsSummary, sum.CondenseID = true, uuid.NewString()
			e := turnEntry(conv, sum)
			for _, id := range stored[conv][:len(stored[conv])/2] {
				e.Changes.Tags = append(e.Changes.Tags, schema.TagChange{MessageID: id, Field: schema.TagCondenseParent, Value: sum.CondenseID})
			}
			return e
		case k == 8 && len(stored[conv]) > 1: // a rewind of the last message
			last := stored[conv][len(stored[conv])-1]
			stored[conv] = stored[conv][:len(stored[conv])-1]
			e := Entry{Input: input(conv, schema.KindRewind), Changes: &schema.Changes{
				State: schema.ConversationState{ConversationID: conv}}}
			e.Changes.Delete = []string{last}
			return e
		case k == 9 && len(stored[conv]) > 0: // an insertion before a message
			e := turnEntry(conv, next(conv, schema.RoleUser, false))
			e.Changes.Insert[0].Before = stored[conv][0]
			return e
		case k == 10: // an append replayed from the changelog: bodies only
			e := turnEntry(conv, next(conv, schema.RoleAssistant, false))
			enc, err := EncodeChanges(e)
			if err != nil {
				t.Fatal(err)
			}
			// As a changelog record carries it: the bodies encoded, the
			// messages' column fields without their content.
			enc.complete = false
			e.Encoded = enc
			e.Changes.Insert[0].Message.Content = schema.Content{}
			return e
		}
		return turnEntry(conv, next(conv, schema.RoleUser, false))
	}
	answered, short := 0, 0
	for step := range 150 {
		var batch []Entry
		for range 1 + rng.IntN(3) {
			batch = append(batch, entryFor(convs[rng.IntN(len(convs))]))
		}
		commit(t, s, batch...)
		for _, conv := range convs {
			full, err := s.readHistory(ctx, conv, false, 0)
			if err != nil {
				t.Fatal(err)
			}
			// The sequences an agent reads after: the last dozen.
			for after := max(1, full.Seq-12); after <= full.Seq+1; after++ {
				for _, visible := range []bool{false, true} {
					want, err := s.readHistory(ctx, conv, visible, after)
					if err != nil {
						t.Fatal(err)
					}
					got, ok := s.recent.read(conv, visible, after)
					if !ok {
						continue
					}
					answered++
					if shorterTail(got, want) {
						// After a reset memory holds only the visible
						// messages appended since: a suffix of SQLite's.
						short++
						continue
					}
					if !reflect.DeepEqual(got, want) {
						t.Fatalf("step %d, %s after %d (visible only %v): from memory\n%+v\nfrom SQLite\n%+v",
							step, conv, after, visible, got, want)
					}
				}
			}
		}
	}
	// Enough reads came from memory for the comparison to mean something,
	// some of them with a tail shorter than SQLite's.
	if answered < 500 || short < 10 {
		t.Fatalf("the recent index answered %d reads, %d with a shorter tail", answered, short)
	}
	t.Logf("%d reads answered from memory, each as SQLite answered it (%d with a shorter tail)", answered, short)
}

// shorterTail tells whether got is want with fewer of the visible messages
// that precede the appended ones: the same appended messages, bodies and
// sequences, messages that are a suffix of want's, and among them the call
// of every tool result appended (the caller looks no further back).
func shorterTail(got, want History) bool {
	n := len(want.Messages) - len(got.Messages)
	if n <= 0 || len(got.Messages) < len(got.Bodies) {
		return false
	}
	w := want
	w.Messages = want.Messages[n:]
	if !reflect.DeepEqual(got, w) {
		return false
	}
	calls := map[string]bool{}
	for _, m := range got.Messages {
		for _, b := range m.Content.Blocks {
			if b.Type == schema.BlockToolUse && m.Role == schema.RoleAssistant {
				calls[b.ID] = true
			}
			if b.Type == schema.BlockToolResult && got.Bodies[m.ID] != nil && !calls[b.ToolUseID] {
				return false
			}
		}
	}
	return true
}

// The index stays within its bytes: the least recently committed
// conversations are dropped.
func TestRecentIsBounded(t *testing.T) {
	r := newRecent(64 << 10)
	body := make([]byte, 1000)
	for i := range 1000 {
		conv := fmt.Sprintf("c%d", i)
		m := schema.Message{Turn: schema.Turn{ID: uuid.NewString(), ConversationID: conv}}
		r.committed(conv, 1, 0, &appended{msgs: []recentMsg{{m: m, body: body, seq: 1}}})
		if r.bytes > r.maxBytes {
			t.Fatalf("%d bytes held, bound %d", r.bytes, r.maxBytes)
		}
	}
	if len(r.convs) == 0 || len(r.convs) > 64 || r.lru.Len() != len(r.convs) {
		t.Fatalf("%d conversations kept (%d in the LRU list)", len(r.convs), r.lru.Len())
	}
	if h, ok := r.read("c999", false, 1); !ok || h.Seq != 1 || len(h.Messages) != 0 {
		t.Fatalf("a read after the last sequence: %+v %v, want nothing new at seq 1", h, ok)
	}
	if _, ok := r.read("c999", false, 0); ok {
		t.Fatal("a whole read (after 0) was answered from memory")
	}
	if _, ok := r.read("c0", false, 0+1); ok {
		t.Fatal("an evicted conversation was answered from memory")
	}
}

// A commit the index did not see (a gap in the sequence) makes it vouch for
// nothing before the next one.
func TestRecentRestartsOnAGap(t *testing.T) {
	r := newRecent(1 << 20)
	m := func(id string) recentMsg {
		return recentMsg{m: schema.Message{Turn: schema.Turn{ID: id}}, body: []byte(`{}`)}
	}
	one, three := m("one"), m("three")
	one.seq, three.seq = 1, 3
	r.committed("c", 1, 0, &appended{prev: 0, msgs: []recentMsg{one}})
	if h, ok := r.read("c", false, 1); !ok || len(h.Messages) != 0 {
		t.Fatalf("after 1: %+v %v", h, ok)
	}
	r.committed("c", 3, 0, &appended{prev: 2, msgs: []recentMsg{three}})
	if h, ok := r.read("c", false, 1); ok {
		t.Fatalf("after 1, with commit 2 unseen: answered %+v", h)
	}
	if h, ok := r.read("c", false, 2); !ok || len(h.Messages) != 1 || h.Messages[0].ID != "three" {
		t.Fatalf("after 2: %+v %v", h, ok)
	}
}

// Between a transaction's COMMIT and the index's update, SQLite may be
// ahead: the conversation's reads go there.
func TestRecentStepsAsideWhileCommitting(t *testing.T) {
	r := newRecent(1 << 20)
	one := recentMsg{m: schema.Message{Turn: schema.Turn{ID: "one"}}, body: []byte(`{}`), seq: 1}
	r.committed("c", 1, 0, &appended{prev: 0, msgs: []recentMsg{one}})
	r.committing([]string{"c", "other"}, 1)
	if h, ok := r.read("c", false, 1); ok {
		t.Fatalf("answered %+v while a commit of the conversation was in flight", h)
	}
	r.committing([]string{"c", "other"}, -1)
	if _, ok := r.read("c", false, 1); !ok {
		t.Fatal("not answered once the commit was recorded")
	}
}

// With fewer than TailMessages held (after a restart), a read whose
// appended messages carry tool results is answered only when an assistant's
// call before each result is held: a call SQLite's longer tail may have, a
// tool_use block in a user message (not a call), or a result answering
// nothing send the read to SQLite.
func TestRecentShortTailNeedsTheCalls(t *testing.T) {
	msg := func(id string, seq int64, role schema.Role, b schema.Block) recentMsg {
		return recentMsg{m: schema.Message{Turn: schema.Turn{ID: id, Role: role, Content: schema.BlockContent(b)}},
			body: []byte(`{}`), seq: seq}
	}
	call := func(id string) schema.Block {
		return schema.Block{Type: schema.BlockToolUse, ID: id, Name: "bash", Input: json.RawMessage(`{}`)}
	}
	result := func(id string) schema.Block {
		return schema.Block{Type: schema.BlockToolResult, ToolUseID: id, Content: &schema.Content{Text: "ok"}}
	}
	for _, tc := range []struct {
		name   string
		before recentMsg // appended at seq 11, after the restart at 10
		answer schema.Block
		ok     bool
	}{
		{"the assistant's call is held", msg("a", 11, schema.RoleAssistant, call("k1")), result("k1"), true},
		{"the call is older than the restart", msg("a", 11, schema.RoleAssistant, call("k0")), result("k1"), false},
		{"a user message's tool_use is no call", msg("a", 11, schema.RoleUser, call("k1")), result("k1"), false},
	} {
		r := newRecent(1 << 20)
		r.committed("c", 10, 10, &appended{prev: 9, unknown: true})
		r.committed("c", 11, 10, &appended{prev: 10, msgs: []recentMsg{tc.before}})
		r.committed("c", 12, 10, &appended{prev: 11, msgs: []recentMsg{msg("b", 12, schema.RoleUser, tc.answer)}})
		h, ok := r.read("c", true, 11)
		if ok != tc.ok {
			t.Fatalf("%s: answered %v (%+v), want %v", tc.name, ok, h, tc.ok)
		}
		if ok && (len(h.Messages) != 2 || h.Messages[0].ID != "a" || h.Bodies["b"] == nil || h.Bodies["a"] != nil) {
			t.Fatalf("%s: %+v, want the held call then the appended result", tc.name, h)
		}
	}
}
