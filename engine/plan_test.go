package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/ctxpipe/ctxpipe/prompts"
	"github.com/ctxpipe/ctxpipe/schema"
)

func TestKeepTailTwelveMessages(t *testing.T) {
	// The seeds' worked example: 12 messages, the first and the last 3 kept,
	// m1..m8 tagged, the assistant summary inserted before m9.
	h := msgs(12)
	p := schema.Profile{ID: "p", ContextWindow: 1000}
	plan, err := PlanCondense(h, &p, "in-1")
	mustNoErr(t, err)
	// Summarized: m0..m8 (no earlier summary), plus the final instruction.
	req := plan.Request.Messages
	if got := join(req[:len(req)-1]); got != "m0 m1 m2 m3 m4 m5 m6 m7 m8" {
		t.Fatalf("summarized %q", got)
	}
	c := plan.Finish("the summary", lenCount)
	if got := join(c.History); got != "m0 m1 m2 m3 m4 m5 m6 m7 m8 S m9 m10 m11" {
		t.Fatalf("history %q", got)
	}
	for i := 1; i <= 8; i++ {
		if c.History[i].CondenseParent != plan.CondenseID {
			t.Fatalf("m%d not tagged", i)
		}
	}
	for _, i := range []int{0, 10, 11, 12} {
		if c.History[i].CondenseParent != "" {
			t.Fatalf("index %d must not be tagged", i)
		}
	}
	s := c.History[9]
	if s.Role != schema.RoleAssistant || !s.IsSummary || s.CondenseID != plan.CondenseID || s.TS != h[9].TS-1 {
		t.Fatalf("summary %+v", s)
	}
	if b := s.Content.Blocks; len(b) != 2 || b[0].Type != schema.BlockReasoning || b[0].Text != prompts.SyntheticReasoning || b[1].Text != "the summary" {
		t.Fatalf("summary content %+v", b)
	}
	if c.MessagesCondensed != 8 {
		t.Fatalf("condensed %d", c.MessagesCondensed)
	}
	if got := join(EffectiveHistory(c.History)); got != "m0 S m9 m10 m11" {
		t.Fatalf("effective %q", got)
	}
	// Changes replayed on the old history give the same result.
	if got := Apply(h, &c.Changes); !reflect.DeepEqual(got, c.History) {
		t.Fatalf("Apply(changes) differs:\n%v\n%v", join(got), join(c.History))
	}
}

func TestKeepTailErrors(t *testing.T) {
	p := schema.Profile{ID: "p", ContextWindow: 1000}
	// 4 messages: slice(0,-3) leaves one message to summarize.
	if _, err := PlanCondense(msgs(4), &p, "in"); schema.ReasonOf(err) != schema.ReasonNotEnoughMessages {
		t.Fatalf("4 messages: %v", err)
	}
	if _, err := PlanCondense(msgs(5), &p, "in"); err != nil {
		t.Fatalf("5 messages are enough: %v", err)
	}
	// A summary among the last 3 (here one appended by a fresh_start
	// condense before the profile changed) → condensed_recently.
	h := msgs(8)
	h = append(h, schema.Message{Turn: schema.Turn{ID: "s", TS: 1075, Role: schema.RoleUser, Content: schema.TextContent("sum")}, IsSummary: true, CondenseID: "c"})
	h = append(h, textMsg(9, "a"), textMsg(10, "b"))
	if _, err := PlanCondense(h, &p, "in2"); schema.ReasonOf(err) != schema.ReasonCondensedRecently {
		t.Fatalf("summary in tail: %v", err)
	}
	// As the seeds define it, a keep_tail summary sits just before the tail,
	// so right after a condense [first, summary] may be condensed again.
	plan, _ := PlanCondense(msgs(12), &p, "in")
	if _, err := PlanCondense(plan.Finish("s", lenCount).History, &p, "in3"); err != nil {
		t.Fatalf("summary just before the tail: %v", err)
	}
}

func TestKeepTailNested(t *testing.T) {
	// A second condense tags the first summary and the messages after it, and
	// leaves earlier tags alone (their parent stays the first condense).
	p := schema.Profile{ID: "p", ContextWindow: 1000}
	h := msgs(12)
	p1, _ := PlanCondense(h, &p, "in-1")
	h = p1.Finish("first", lenCount).History
	for i := 12; i < 16; i++ {
		h = append(h, textMsg(i, "more"))
	}
	p2, err := PlanCondense(h, &p, "in-2")
	mustNoErr(t, err)
	// Since the last (assistant) summary, with the first message in front.
	req := p2.Request.Messages
	if got := join(req[:len(req)-1]); got != "m0 S m9 m10 m11 m12" {
		t.Fatalf("second request %q", got)
	}
	h2 := p2.Finish("second", lenCount).History
	if got := join(EffectiveHistory(h2)); got != "m0 S m13 m14 m15" {
		t.Fatalf("effective %q", got)
	}
	if h2[1].CondenseParent != p1.CondenseID || h2[9].CondenseParent != p2.CondenseID {
		t.Fatalf("nesting lost: m1 %q, first summary %q", h2[1].CondenseParent, h2[9].CondenseParent)
	}
}

func TestKeepTailToolCarryOver(t *testing.T) {
	// The first kept message answers a tool call: the call (and the reasoning
	// next to it) goes into the summary, so the tool_result keeps its tool_use.
	h := msgs(9)
	h[7].Content = schema.BlockContent(
		schema.Block{Type: schema.BlockReasoning, Text: "think"},
		schema.Block{Type: schema.BlockText, Text: "reading"},
		toolUse("call_1", "read_file", `{"path":"a.go"}`),
	)
	h[8].Content = schema.BlockContent(toolResult("call_1", "package a"))
	h = append(h, textMsg(9, "ok"), textMsg(10, "next"))
	// keepStart = 8: h[8] holds the tool_result, h[7] the tool_use.
	p := schema.Profile{ID: "p", ContextWindow: 1000}
	plan, err := PlanCondense(h, &p, "in")
	mustNoErr(t, err)
	c := plan.Finish("sum", lenCount)
	b := c.Summary.Content.Blocks
	types := []schema.BlockType{}
	for _, x := range b {
		types = append(types, x.Type)
	}
	want := []schema.BlockType{schema.BlockReasoning, schema.BlockReasoning, schema.BlockText, schema.BlockToolUse}
	if !reflect.DeepEqual(types, want) || b[1].Text != "think" || b[3].ID != "call_1" || string(b[3].Input) != `{"path":"a.go"}` {
		t.Fatalf("summary blocks %+v", b)
	}
	eff := EffectiveHistory(c.History)
	if got := join(eff); got != "m0 S m8 m9 m10" {
		t.Fatalf("effective %q", got)
	}
	if !eff[2].Content.HasBlock(schema.BlockToolResult) {
		t.Fatal("the tool_result must stay: its tool_use is in the summary")
	}
}

func TestTruncateElevenVisible(t *testing.T) {
	// The seeds' example: 11 visible → floor(10 × 0.5) = 5 → 4 (even).
	h := msgs(11)
	tr, ok := PlanTruncation(h, 0.5, "trunc-1", lenCount)
	if !ok || tr.Removed != 4 {
		t.Fatalf("removed %d ok=%v", tr.Removed, ok)
	}
	if got := join(tr.History); got != "m0 m1 m2 m3 m4 T m5 m6 m7 m8 m9 m10" {
		t.Fatalf("history %q", got)
	}
	for i := 1; i <= 4; i++ {
		if tr.History[i].TruncationParent != "trunc-1" {
			t.Fatalf("m%d not tagged", i)
		}
	}
	m := tr.History[5]
	if !m.IsTruncationMarker || m.TruncationID != "trunc-1" || m.Role != schema.RoleUser || m.TS != h[5].TS-1 ||
		m.Content.Text != "[Sliding window truncation: 4 messages hidden to reduce context]" {
		t.Fatalf("marker %+v", m)
	}
	if got := join(EffectiveHistory(tr.History)); got != "m0 T m5 m6 m7 m8 m9 m10" {
		t.Fatalf("effective %q", got)
	}
}

func TestTruncateCases(t *testing.T) {
	cases := []struct {
		n, removed int
	}{{0, 0}, {1, 0}, {2, 0}, {3, 0}, {4, 0}, {5, 2}, {6, 2}, {7, 2}, {8, 2}, {9, 4}, {10, 4}, {100, 48}}
	for _, c := range cases {
		tr, ok := PlanTruncation(msgs(c.n), 0.5, "t", lenCount)
		if ok != (c.removed > 0) || tr.Removed != c.removed {
			t.Errorf("%d visible: removed %d ok=%v, want %d", c.n, tr.Removed, ok, c.removed)
		}
	}
}

func TestSecondTruncationHidesOldMarker(t *testing.T) {
	h := msgs(11)
	t1, _ := PlanTruncation(h, 0.5, "t1", lenCount)
	// Visible now: m0 m5..m10 (7) → floor(6/2)=3 → 2: m5, m6 hidden, and T1 too.
	t2, ok := PlanTruncation(t1.History, 0.5, "t2", lenCount)
	if !ok || t2.Removed != 2 {
		t.Fatalf("removed %d", t2.Removed)
	}
	if got := join(EffectiveHistory(t2.History)); got != "m0 T m7 m8 m9 m10" {
		t.Fatalf("effective %q", got)
	}
	// Rewinding the second truncation brings back m5, m6 and the first marker.
	evs := []schema.ContextEventRef{
		{Type: schema.EventSlidingWindowTruncation, ID: "t1", TS: 1},
		{Type: schema.EventSlidingWindowTruncation, ID: "t2", TS: 5000},
	}
	rw, ok := PlanRewind(t2.History, evs, 5000, false)
	if !ok || !reflect.DeepEqual(rw.RemovedTruncationIDs, []string{"t2"}) {
		t.Fatalf("rewind %+v", rw)
	}
	if got := join(EffectiveHistory(rw.History)); got != "m0 T m5 m6 m7 m8 m9 m10" {
		t.Fatalf("after rewind %q", got)
	}
	if rw.MessagesRestored != 2 {
		t.Fatalf("restored %d", rw.MessagesRestored)
	}
}

func TestRewindRestoresCondensed(t *testing.T) {
	// The seeds' rewind cleanup: removing the condense event removes its
	// summary (even though the summary's ts is before the cutoff), and
	// clearing the orphaned tags restores every message exactly.
	orig := msgs(12)
	p := schema.Profile{ID: "p", ContextWindow: 1000}
	plan, _ := PlanCondense(orig, &p, "in")
	h := plan.Finish("s", lenCount).History
	evs := []schema.ContextEventRef{{Type: schema.EventCondenseContext, ID: plan.CondenseID, TS: orig[11].TS}}
	// Cut at m11 (the turn that caused the condense), keeping it.
	rw, ok := PlanRewind(h, evs, orig[11].TS, true)
	if !ok {
		t.Fatal("nothing rewound")
	}
	if !reflect.DeepEqual(rw.History, orig) {
		t.Fatalf("not restored exactly:\n%v", join(rw.History))
	}
	if rw.MessagesRemoved != 0 || rw.MessagesRestored != 8 || len(rw.RemovedCondenseIDs) != 1 {
		t.Fatalf("%+v", rw)
	}
	// Without the target: m11 goes too.
	rw, _ = PlanRewind(h, evs, orig[11].TS, false)
	if !reflect.DeepEqual(rw.History, orig[:11]) || rw.MessagesRemoved != 1 {
		t.Fatalf("without target: %v removed %d", join(rw.History), rw.MessagesRemoved)
	}
	// A cutoff before the event but after the messages it hid: the tail is
	// cut and the condense undone.
	rw, _ = PlanRewind(h, evs, orig[10].TS, false)
	if !reflect.DeepEqual(rw.History, orig[:10]) {
		t.Fatalf("cut at m10: %v", join(rw.History))
	}
}

func TestRewindRaceAdjustment(t *testing.T) {
	// No message has the cutoff ts, but older ones exist: the cutoff moves to
	// the first user message at or after it.
	h := msgs(6) // ts 1000..1050; m4 (1040) is the first user turn at or after 1025
	rw, ok := PlanRewind(h, nil, 1025, false)
	if !ok || rw.CutoffTS != 1040 || join(rw.History) != "m0 m1 m2 m3" {
		t.Fatalf("cutoff %d history %q", rw.CutoffTS, join(rw.History))
	}
	if _, ok := PlanRewind(h, nil, 9999, false); ok {
		t.Fatal("a cutoff after everything rewinds nothing")
	}
}

func TestCleanup(t *testing.T) {
	h := msgs(4)
	h[1].CondenseParent = "gone"
	h[2].TruncationParent = "gone-too"
	h = append(h, schema.Message{Turn: schema.Turn{ID: "live", Role: schema.RoleUser}, IsTruncationMarker: true, TruncationID: "live"})
	h[3].TruncationParent = "live"
	got := Cleanup(h)
	want := []schema.TagChange{
		{MessageID: msgID(1), Field: schema.TagCondenseParent},
		{MessageID: msgID(2), Field: schema.TagTruncationParent},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("cleanup %+v", got)
	}
}

func TestEffectiveDropsOrphanToolResults(t *testing.T) {
	h := msgs(6)
	h[1].Content = schema.BlockContent(toolUse("a", "x", `{}`))
	h[2].Content = schema.BlockContent(toolResult("a", "ok"))
	h[3].Content = schema.BlockContent(toolUse("b", "x", `{}`))
	h[4].Content = schema.BlockContent(toolResult("b", "ok"), schema.Block{Type: schema.BlockText, Text: "and"})
	h = append(h, schema.Message{Turn: schema.Turn{ID: "mk", TS: 1, Role: schema.RoleUser}, IsTruncationMarker: true, TruncationID: "t"})
	h[3].TruncationParent = "t" // hide the second call
	eff := EffectiveHistory(h)
	if got := join(eff); got != "m0 m1 m2 m4 m5 T" {
		t.Fatalf("effective %q", got)
	}
	if b := eff[3].Content.Blocks; len(b) != 1 || b[0].Type != schema.BlockText {
		t.Fatalf("orphan result kept: %+v", b)
	}
	if len(h[4].Content.Blocks) != 2 {
		t.Fatal("the stored message must not change")
	}
	// A user message that held only an orphaned result disappears.
	h[4].Content = schema.BlockContent(toolResult("b", "ok"))
	if got := join(EffectiveHistory(h)); got != "m0 m1 m2 m5 T" {
		t.Fatalf("effective %q", got)
	}
}

func TestFreshStart(t *testing.T) {
	h := msgs(6)
	h[0].Content = schema.TextContent("do it <command>make test</command> please")
	// m3 calls c1 and the agent moves on without its result; m5's call c2
	// waits for its result.
	h[3].Content = schema.BlockContent(schema.Block{Type: schema.BlockText, Text: "running"}, toolUse("c1", "bash", `{"cmd":"ls"}`))
	h[5].Content = schema.BlockContent(schema.Block{Type: schema.BlockText, Text: "again"}, toolUse("c2", "bash", `{"cmd":"ls -l"}`))
	p := schema.Profile{ID: "p", ContextWindow: 1000, Strategy: schema.StrategyFreshStart, KeepTask: boolp(false)} // Roo's and Gemini's own behaviour
	plan, err := PlanCondense(h, &p, "in")
	mustNoErr(t, err)
	req := plan.Request.Messages
	// m0..m4, a synthetic result for the abandoned call, the final instruction.
	if len(req) != 7 {
		t.Fatalf("request has %d messages", len(req))
	}
	if b := req[3].Content.Blocks; b[1].Type != schema.BlockText || !strings.HasPrefix(b[1].Text, "Tool: bash\nArguments: {\"cmd\":\"ls\"}") {
		t.Fatalf("tool_use not turned into text: %+v", b)
	}
	if b := req[5].Content.Blocks; len(b) != 1 || b[0].Type != schema.BlockText || !strings.Contains(b[0].Text, prompts.ToolDeferred) {
		t.Fatalf("synthetic tool result %+v", b)
	}
	c := plan.Finish("sum", lenCount)
	// The pending call stays visible after the summary.
	if got := join(c.History); got != "m0 m1 m2 m3 m4 S m5" {
		t.Fatalf("history %q", got)
	}
	if got := join(EffectiveHistory(c.History)); got != "S m5" {
		t.Fatalf("effective %q", got)
	}
	s := c.Summary
	if s.Role != schema.RoleUser || s.TS != h[5].TS-1 || c.MessagesCondensed != 5 {
		t.Fatalf("summary %+v condensed %d", s, c.MessagesCondensed)
	}
	if b := s.Content.Blocks; len(b) != 2 || !strings.Contains(b[1].Text, "<command>make test</command>") {
		t.Fatalf("command block not carried: %+v", b)
	}
	if _, err := PlanCondense(c.History, &p, "in2"); schema.ReasonOf(err) != schema.ReasonCondensedRecently {
		t.Fatalf("summary last: %v", err)
	}
	if _, err := PlanCondense(msgs(1), &p, "in3"); schema.ReasonOf(err) != schema.ReasonNotEnoughMessages {
		t.Fatalf("one message: %v", err)
	}
	// Truncation after a fresh start works on the effective history.
	h2 := c.History
	for i := 6; i < 12; i++ {
		h2 = append(h2, textMsg(i, "later"))
	}
	tr, ok := PlanTruncation(h2, 0.5, "t", lenCount)
	if !ok || tr.Removed != 2 {
		t.Fatalf("truncation after fresh start removed %d", tr.Removed)
	}
	if got := join(EffectiveHistory(tr.History)); got != "S T m7 m8 m9 m10 m11" {
		t.Fatalf("effective %q", got)
	}
}

func TestSplitPoint(t *testing.T) {
	u := func(n int) schema.Message {
		return schema.Message{Turn: schema.Turn{Role: schema.RoleUser, Content: schema.TextContent(strings.Repeat("u", n))}}
	}
	a := func(n int) schema.Message {
		return schema.Message{Turn: schema.Turn{Role: schema.RoleAssistant, Content: schema.TextContent(strings.Repeat("a", n))}}
	}
	call := schema.Message{Turn: schema.Turn{Role: schema.RoleAssistant, Content: schema.BlockContent(toolUse("x", "t", `{}`))}}
	result := schema.Message{Turn: schema.Turn{Role: schema.RoleUser, Content: schema.BlockContent(toolResult("x", "r"))}}
	callOf := func(n int, ids ...string) schema.Message {
		blocks := []schema.Block{{Type: schema.BlockText, Text: strings.Repeat("c", n)}}
		for _, id := range ids {
			blocks = append(blocks, toolUse(id, "t", `{}`))
		}
		return schema.Message{Turn: schema.Turn{Role: schema.RoleAssistant, Content: schema.BlockContent(blocks...)}}
	}
	resultOf := func(id string) schema.Message {
		return schema.Message{Turn: schema.Turn{Role: schema.RoleUser, Content: schema.BlockContent(toolResult(id, "r"))}}
	}
	cases := []struct {
		name string
		h    []schema.Message
		want int
	}{
		{"even turns split at 70%", []schema.Message{u(100), a(100), u(100), a(100), u(100), a(100), u(100), a(100), u(100), a(100)}, 8},
		{"all compressed when the last is a plain answer", []schema.Message{u(10), a(1000)}, 2},
		{"never everything when the last is a tool call", []schema.Message{u(10), a(1000), u(10), call}, 2},
		{"a tool result is no split point; the turn after its exchange is", []schema.Message{u(10), callOf(1000, "x"), result, a(10), u(10)}, 3},
		{"never between a call and its results", []schema.Message{u(10), callOf(1000, "A", "B"), resultOf("A"), resultOf("B"), callOf(10, "C"), resultOf("C"), a(10)}, 4},
		{"an agent run: the pending call is kept", []schema.Message{u(10), callOf(1000, "A"), resultOf("A"), callOf(10, "B")}, 3},
		{"an unfinished exchange is no boundary", []schema.Message{u(10), callOf(1000, "A", "B"), resultOf("A"), callOf(10, "C")}, 0},
		{"empty", nil, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := SplitPoint(c.h, 0.7); got != c.want {
				t.Fatalf("split %d, want %d", got, c.want)
			}
		})
	}
}

// On plain-text histories SplitPoint is Gemini's findCompressSplitPoint,
// which measures each message as JSON.stringify of its Gemini Content, in
// JavaScript characters: a CJK text weighs its characters, not its UTF-8
// bytes, and each message carries the Content's wrapper (conformance run,
// D4). geminiSplit is that function, written from the seed's description.
func TestSplitPointMeasuresAsGemini(t *testing.T) {
	geminiSplit := func(h []schema.Message, fraction float64) int {
		sizes, total := make([]int, len(h)), 0
		for i, m := range h {
			role := "user"
			if m.Role == schema.RoleAssistant {
				role = "model"
			}
			text, _ := json.Marshal(m.Content.Text)
			js := `{"role":"` + role + `","parts":[{"text":` + string(text) + `}]}`
			sizes[i] = len(utf16.Encode([]rune(js)))
			total += sizes[i]
		}
		cum, last := 0, 0
		for i, m := range h {
			if m.Role == schema.RoleUser {
				if float64(cum) >= float64(total)*fraction {
					return i
				}
				last = i
			}
			cum += sizes[i]
		}
		if len(h) > 0 && h[len(h)-1].Role == schema.RoleAssistant {
			return len(h)
		}
		return last
	}
	texts := func(ts ...string) []schema.Message {
		var h []schema.Message
		for i, t := range ts {
			role := schema.RoleUser
			if i%2 == 1 {
				role = schema.RoleAssistant
			}
			h = append(h, schema.Message{Turn: schema.Turn{Role: role, Content: schema.TextContent(t)}})
		}
		return h
	}
	x := strings.Repeat("x", 100)
	for _, c := range []struct {
		name string
		h    []schema.Message
	}{
		{"ASCII", texts(x, x, x, x, x, x)},
		{"CJK first", texts(strings.Repeat("あ", 100), x, x, x, x, x)},
		{"emoji (two UTF-16 units each)", texts(strings.Repeat("🙂", 60), x, x, x, x, x, x)},
		{"short turns: the wrapper counts", texts(strings.Repeat("w", 200), "a", "b", "c", strings.Repeat("w", 20), strings.Repeat("w", 20), strings.Repeat("w", 20))},
		{"quotes and newlines escaped", texts(strings.Repeat("\"\n", 50), x, x, x)},
	} {
		if got, want := SplitPoint(c.h, 0.7), geminiSplit(c.h, 0.7); got != want {
			t.Errorf("%s: split %d, Gemini's %d", c.name, got, want)
		}
	}
}

func TestPreserveFraction(t *testing.T) {
	h := msgs(10)
	p := schema.Profile{ID: "p", ContextWindow: 1000, Strategy: schema.StrategyPreserveFraction, KeepTask: boolp(false)} // Roo's and Gemini's own behaviour
	plan, err := PlanCondense(h, &p, "in")
	mustNoErr(t, err)
	c := plan.Finish("snapshot", lenCount)
	split := SplitPoint(h, 0.7)
	if split == 0 || split >= 10 {
		t.Fatalf("split %d", split)
	}
	eff := EffectiveHistory(c.History)
	if !eff[0].IsCondenseSummary() || eff[0].Role != schema.RoleUser || eff[0].TS != h[split].TS-1 || len(eff) != 2+10-split {
		t.Fatalf("effective %q", join(eff))
	}
	// Gemini's model turn after the snapshot: the kept part opens with a
	// user message, which must not follow the user summary directly.
	if h[split].Role != schema.RoleUser {
		t.Fatalf("split at a %s message; this test wants a user one", h[split].Role)
	}
	ack := eff[1]
	if !ack.IsSummaryAck || ack.IsCondenseSummary() || !ack.IsSummary || ack.Role != schema.RoleAssistant ||
		ack.CondenseID != eff[0].CondenseID || ack.TS != eff[0].TS || ack.Content.Text != prompts.SummaryAck || ack.Tokens != lenCount(ack.Content) {
		t.Fatalf("acknowledgement %+v", ack)
	}
	if ack.ID == eff[0].ID || ack.ID != DeriveID(eff[0].CondenseID, "ack") {
		t.Fatalf("acknowledgement id %q (summary %q)", ack.ID, eff[0].ID)
	}
	if c.MessagesCondensed != split {
		t.Fatalf("condensed %d, split %d", c.MessagesCondensed, split)
	}
	if len(plan.Request.Messages) != split+1 {
		t.Fatalf("request %d messages", len(plan.Request.Messages))
	}
}

func TestStripImages(t *testing.T) {
	img := schema.Block{Type: schema.BlockImage, Source: &schema.ImageSource{Type: "base64", MediaType: "image/png", Data: "AAAA"}}
	nested := schema.BlockContent(img)
	h := msgs(8)
	h[2].Content = schema.BlockContent(img, schema.Block{Type: schema.BlockText, Text: "look"})
	h[3].Content = schema.BlockContent(toolUse("i", "shot", `{}`))
	h[4].Content = schema.BlockContent(schema.Block{Type: schema.BlockToolResult, ToolUseID: "i", Content: &nested})
	p := schema.Profile{ID: "p", ContextWindow: 1000}
	plan, err := PlanCondense(h, &p, "in")
	mustNoErr(t, err)
	for _, m := range plan.Request.Messages {
		for _, b := range m.Content.Blocks {
			if b.Type == schema.BlockImage {
				t.Fatal("image left in the request")
			}
			if b.Content != nil && b.Content.HasBlock(schema.BlockImage) {
				t.Fatal("image left inside a tool result")
			}
		}
	}
	if h[2].Content.Blocks[0].Type != schema.BlockImage {
		t.Fatal("the stored message must keep its image")
	}
}

func TestCommandBlocksCarried(t *testing.T) {
	cases := []struct {
		name  string
		first schema.Content
		want  []string // substrings the summary's reminder must hold
	}{
		{"bare tag", schema.TextContent("do it <command>make test</command> please"), []string{"<command>make test</command>"}},
		{"tag with attributes", schema.TextContent(`<command name="deploy" env="prod">ship the release</command>`), []string{`<command name="deploy" env="prod">ship the release</command>`}},
		{"two blocks of one tag", schema.BlockContent(
			schema.Block{Type: schema.BlockText, Text: `first <command name="deploy">step one`},
			schema.Block{Type: schema.BlockText, Text: "step two</command> done"},
		), []string{`<command name="deploy">step one`, "step two</command>"}},
		{"two tags", schema.TextContent("<command>a</command> and <command name=\"b\">b</command>"), []string{"<command>a</command>", `<command name="b">b</command>`}},
		{"not a command tag", schema.TextContent("<commands>x</commands> <commander>y</command>"), nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := msgs(6)
			h[0].Content = tc.first
			p := schema.Profile{ID: "p", ContextWindow: 1000, Strategy: schema.StrategyFreshStart, KeepTask: boolp(false)} // Roo's and Gemini's own behaviour
			plan, err := PlanCondense(h, &p, "in")
			mustNoErr(t, err)
			b := plan.Finish("sum", lenCount).Summary.Content.Blocks
			if tc.want == nil {
				if len(b) != 1 {
					t.Fatalf("no command, yet the summary has %d blocks: %+v", len(b), b)
				}
				return
			}
			if len(b) != 2 || !strings.HasPrefix(b[1].Text, "<system-reminder>") {
				t.Fatalf("command not carried: %+v", b)
			}
			for _, w := range tc.want {
				if !strings.Contains(b[1].Text, w) {
					t.Fatalf("reminder %q lacks %q", b[1].Text, w)
				}
			}
		})
	}
}

func TestTruncationNeverPanics(t *testing.T) {
	fracs := []float64{math.Inf(-1), -1, 0, 0.1, 0.5, 0.9, 0.99, 1, 1.5, 2, 1e300, math.Inf(1), math.NaN()}
	for n := 0; n <= 12; n++ {
		for _, f := range fracs {
			h := msgs(n)
			tr, ok := PlanTruncation(h, f, "t", lenCount)
			checkTruncation(t, h, tr, ok, fmt.Sprintf("%d messages, fraction %v", n, f))
		}
	}
}

// checkTruncation: the first and the last visible messages stay visible, a
// truncation hides something, and its changes replay to its history.
func checkTruncation(t *testing.T, h []schema.Message, tr Truncation, ok bool, what string) {
	t.Helper()
	if !ok {
		if tr.Removed != 0 || len(tr.History) != 0 {
			t.Fatalf("%s: not ok, yet %+v", what, tr)
		}
		return
	}
	before, after := EffectiveHistory(h), EffectiveHistory(tr.History)
	if tr.Removed <= 0 || len(after) >= len(before) {
		t.Fatalf("%s: removed %d, effective %d → %d", what, tr.Removed, len(before), len(after))
	}
	if after[0].ID != before[0].ID || after[len(after)-1].ID != before[len(before)-1].ID {
		t.Fatalf("%s: first or last visible message hidden: %q → %q", what, join(before), join(after))
	}
	if got := Apply(h, &tr.Changes); !reflect.DeepEqual(got, tr.History) {
		t.Fatalf("%s: changes do not replay", what)
	}
}

// FuzzPlanTruncation: no history and no fraction panics the exported planner.
func FuzzPlanTruncation(f *testing.F) {
	f.Add([]byte{5, 1, 2, 3}, 1.0)
	f.Add([]byte{12, 0, 0, 9, 9}, 0.5)
	f.Add([]byte{3}, math.Inf(1))
	f.Fuzz(func(t *testing.T, shape []byte, frac float64) {
		if len(shape) == 0 || len(shape) > 64 {
			return
		}
		h := msgs(int(shape[0]) % 40)
		// Hide, mark and duplicate at random: the planner must take any history.
		for i, b := range shape[1:] {
			if len(h) == 0 {
				break
			}
			j := (i*7 + int(b)) % len(h)
			switch b % 6 {
			case 1:
				h[j].TruncationParent = "gone"
			case 2:
				h[j].IsTruncationMarker, h[j].TruncationID = true, fmt.Sprintf("m%d", b)
			case 3:
				h[j].TruncationParent = fmt.Sprintf("m%d", b)
			case 4:
				h[j].ID = h[(j+1)%len(h)].ID
			case 5:
				h[j].Content = schema.BlockContent(toolResult(fmt.Sprintf("c%d", b%3), "r"))
			}
		}
		tr, ok := PlanTruncation(h, frac, "t", lenCount)
		if ok && tr.Removed <= 0 {
			t.Fatalf("ok with %d removed", tr.Removed)
		}
	})
}

func TestFreshStartNeedsTwoMessagesSinceSummary(t *testing.T) {
	p := schema.Profile{ID: "p", ContextWindow: 1000, Strategy: schema.StrategyFreshStart, KeepTask: boolp(false)} // Roo's and Gemini's own behaviour
	plan, err := PlanCondense(msgs(6), &p, "in")
	mustNoErr(t, err)
	h := plan.Finish("sum", lenCount).History
	cases := []struct {
		after int
		want  schema.Reason
	}{{0, schema.ReasonCondensedRecently}, {1, schema.ReasonCondensedRecently}, {2, ""}, {3, ""}}
	for _, tc := range cases {
		hh := append([]schema.Message(nil), h...)
		for i := 0; i < tc.after; i++ {
			hh = append(hh, textMsg(6+i, "later"))
		}
		if _, err := PlanCondense(hh, &p, "in2"); schema.ReasonOf(err) != tc.want || (tc.want == "" && err != nil) {
			t.Errorf("%d after the summary: %v, want %q", tc.after, err, tc.want)
		}
	}
	// With keep_task, a kept instruction after the summary counts toward
	// Roo's two messages: the instruction and a reply are enough (the
	// summary and the reply are summarized, the instruction stays). The
	// instruction alone is condensed_recently. (Review: the count left
	// kept messages out.)
	kp := p
	kp.KeepTask = nil
	h2 := append(slices.Clone(h), textMsg(6, "now fix the parser"))
	if _, err := PlanCondense(h2, &kp, "in3"); schema.ReasonOf(err) != schema.ReasonCondensedRecently {
		t.Errorf("a kept instruction alone after the summary: %v", err)
	}
	if _, err := PlanCondense(append(h2, textMsg(7, "on it")), &kp, "in3"); err != nil {
		t.Errorf("a kept instruction and a reply after the summary: %v", err)
	}
	// Through the engine, a manual request gets condense_failed with the
	// reason. (A reserve for the reply that leaves room: with the default
	// one, 8,192 tokens, a 1,000-token window is always over its allowed
	// size, and every turn would condense on its own.)
	p.MaxTokens = 100
	c := newConv(&fixedSummarizer{text: "s"}, p)
	ctx := context.Background()
	for i := 0; i < 6; i++ {
		_, err := c.Append(ctx, turnOf(i, 10))
		mustNoErr(t, err)
	}
	condense := func(id int) []schema.Event {
		evs, err := c.Apply(ctx, schema.Input{Kind: schema.KindCondense, ID: msgID(id), ConversationID: testConv, TS: 2000 + int64(id), Trigger: schema.TriggerManual})
		mustNoErr(t, err)
		return evs
	}
	if evs := condense(100); len(evs) != 2 || evs[1].Header().Type != schema.EventCondenseContext {
		t.Fatalf("first condense %v", types(evs))
	}
	_, err = c.Append(ctx, turnOf(6, 10))
	mustNoErr(t, err)
	evs := condense(101)
	if f, ok := evs[len(evs)-1].(*schema.CondenseFailed); !ok || f.Error != schema.ReasonCondensedRecently {
		t.Fatalf("one message after the summary: %v", types(evs))
	}
}

func TestTruncationKeepsToolExchanges(t *testing.T) {
	// Parallel calls answered one turn per call: a cut between the result
	// turns would hide the call and drop the results after the cut.
	h := msgs(10)
	h[3].Content = schema.BlockContent(toolUse("A", "bash", `{}`), toolUse("B", "bash", `{}`), toolUse("C", "bash", `{}`))
	for i, id := range []string{"A", "B", "C"} {
		h[4+i].Role = schema.RoleUser
		h[4+i].Content = schema.BlockContent(toolResult(id, "out"))
	}
	h[7].Role = schema.RoleAssistant
	for _, f := range []float64{0.3, 0.5, 0.6, 0.7, 0.8, 1} {
		tr, ok := PlanTruncation(h, f, "t", lenCount)
		checkTruncation(t, h, tr, ok, fmt.Sprintf("fraction %v", f))
		if !ok {
			continue
		}
		if lost := lostResults(tr.History); len(lost) > 0 {
			t.Fatalf("fraction %v: results %v dropped, effective %q", f, lost, join(EffectiveHistory(tr.History)))
		}
	}
}

// When stepping back from a cut inside a tool exchange reaches the task (the
// call is the first message after it), the truncation steps forward past the
// exchange instead: a context over its allowed size still shrinks (an
// outside conformance run found it truncating nothing here).
func TestTruncationStepsForwardPastAnExchangeAfterTheTask(t *testing.T) {
	h := msgs(7)
	h[1].Content = schema.BlockContent(toolUse("X", "bash", `{}`), toolUse("Y", "bash", `{}`))
	h[2].Content = schema.BlockContent(toolResult("X", "out"))
	h[3].Role = schema.RoleUser
	h[3].Content = schema.BlockContent(toolResult("Y", "out"))
	h[4].Role = schema.RoleAssistant
	h[5].Role = schema.RoleUser
	h[6].Role = schema.RoleAssistant
	tr, ok := PlanTruncation(h, 0.5, "t", lenCount)
	checkTruncation(t, h, tr, ok, "step forward")
	if !ok || tr.Removed != 3 {
		t.Fatalf("removed %d, ok %v: want the whole exchange (3 messages) hidden", tr.Removed, ok)
	}
	if got := join(EffectiveHistory(tr.History)); got != "m0 T m4 m5 m6" {
		t.Fatalf("effective %q", got)
	}
	if lost := lostResults(tr.History); len(lost) > 0 {
		t.Fatalf("results %v dropped", lost)
	}
}

// messages_condensed counts what the condense hid from the effective
// history: not the messages an earlier truncation hid already, which it
// tags all the same (an outside conformance run saw 8 for 3).
func TestMessagesCondensedCountsWhatWasVisible(t *testing.T) {
	for _, s := range []schema.Strategy{schema.StrategyKeepTail, schema.StrategyFreshStart, schema.StrategyPreserveFraction} {
		t.Run(string(s), func(t *testing.T) {
			tr, ok := PlanTruncation(msgs(16), 0.5, "t", lenCount)
			if !ok {
				t.Fatal("nothing truncated")
			}
			p := schema.Profile{ID: "p", ContextWindow: 1000, Strategy: s}
			plan, err := PlanCondense(tr.History, &p, "in")
			mustNoErr(t, err)
			c := plan.Finish("summary", lenCount)
			before, after := EffectiveHistory(tr.History), EffectiveHistory(c.History)
			// Markers are not counted (as a truncation's messages_removed
			// leaves them out); the summary and preserve_fraction's
			// acknowledgement were added.
			counted := func(ms []schema.Message) (n int) {
				for _, m := range ms {
					if !m.IsTruncationMarker {
						n++
					}
				}
				return n
			}
			added := 0
			for _, m := range after {
				if m.IsSummary {
					added++
				}
			}
			if want := counted(before) - (counted(after) - added); c.MessagesCondensed != want || want <= 0 {
				t.Fatalf("messages_condensed %d, but %d visible messages were hidden (%d → %d, %d added)",
					c.MessagesCondensed, want, len(before), len(after), added)
			}
		})
	}
}

// preserve_fraction's acknowledgement (Gemini's model turn after its
// snapshot) lives and goes with its summary: it follows the summary when
// everything is compressed, a rewind of the condense deletes both and
// restores the history exactly, summarizing the pair again is
// condensed_recently, and it is no summary of its own for what reads the
// last summary.
func TestPreserveFractionAcknowledgement(t *testing.T) {
	p := schema.Profile{ID: "p", ContextWindow: 1000, Strategy: schema.StrategyPreserveFraction, KeepTask: boolp(false)}
	t.Run("everything compressed", func(t *testing.T) {
		orig := msgs(4) // ends with an assistant message without calls
		plan, err := PlanCondense(orig, &p, "in")
		mustNoErr(t, err)
		c := plan.Finish("snapshot", lenCount)
		eff := EffectiveHistory(c.History)
		if got := join(eff); got != "S S" || eff[0].Role != schema.RoleUser || !eff[1].IsSummaryAck || eff[1].Role != schema.RoleAssistant {
			t.Fatalf("effective %q", got)
		}
		if eff[1].TS != orig[3].TS || len(c.Changes.Insert) != 2 || c.Changes.Insert[0].Before != "" || c.Changes.Insert[1].Before != "" {
			t.Fatalf("ack ts %d, inserts %+v", eff[1].TS, c.Changes.Insert)
		}
		evs := []schema.ContextEventRef{{Type: schema.EventCondenseContext, ID: plan.CondenseID, TS: orig[3].TS}}
		rw, ok := PlanRewind(c.History, evs, orig[3].TS, true)
		if !ok || !reflect.DeepEqual(rw.History, orig) || len(rw.Changes.Delete) != 2 {
			t.Fatalf("rewind: ok %v, %q, deletes %v", ok, join(rw.History), rw.Changes.Delete)
		}
	})
	t.Run("again at once", func(t *testing.T) {
		h := msgs(10)
		plan, err := PlanCondense(h, &p, "in")
		mustNoErr(t, err)
		h = plan.Finish(strings.Repeat("snapshot ", 40), lenCount).History
		// Only the summary and its acknowledgement lie before any split.
		h = append(h, textMsg(10, "x"))
		_, err = PlanCondense(h, &p, "in2")
		var se *schema.Error
		if !errors.As(err, &se) || se.Reason != schema.ReasonCondensedRecently {
			t.Fatalf("err %v, want condensed_recently; history %q", err, join(EffectiveHistory(h)))
		}
		// keep_tail and fresh_start read the user summary as the last one.
		if since := sinceLastSummary(h, h); !since[0].IsCondenseSummary() {
			t.Fatalf("since the last summary: %q", join(since))
		}
	})
	t.Run("again at once, the task kept", func(t *testing.T) {
		// With keep_task (the default) the task, not the summary, opens
		// the effective history: summarizing again is still
		// condensed_recently, not not_enough_messages (review).
		kp := p
		kp.KeepTask = nil
		h := msgs(10)
		plan, err := PlanCondense(h, &kp, "in")
		mustNoErr(t, err)
		h = append(plan.Finish(strings.Repeat("snapshot ", 40), lenCount).History, textMsg(10, "x"))
		if eff := EffectiveHistory(h); !eff[1].IsCondenseSummary() {
			t.Fatalf("effective %q: the test wants the task, then the summary", join(eff))
		}
		var se *schema.Error
		if _, err := PlanCondense(h, &kp, "in2"); !errors.As(err, &se) || se.Reason != schema.ReasonCondensedRecently {
			t.Fatalf("err %v, want condensed_recently; history %q", err, join(EffectiveHistory(h)))
		}
	})
	t.Run("no agent message", func(t *testing.T) {
		plan, err := PlanCondense(msgs(4), &p, "in")
		mustNoErr(t, err)
		h := append(plan.Finish("snapshot", lenCount).History, textMsg(4, "x"))
		// fresh_start needs two agent messages since the last summary: the
		// acknowledgement is not one.
		fs := p
		fs.Strategy = schema.StrategyFreshStart
		var se *schema.Error
		if _, err := PlanCondense(h, &fs, "in2"); !errors.As(err, &se) || se.Reason != schema.ReasonCondensedRecently {
			t.Fatalf("fresh_start after it: %v", err)
		}
		if _, err := PlanCondense(append(h, textMsg(5, "y")), &fs, "in3"); err != nil {
			t.Fatalf("fresh_start after two agent messages: %v", err)
		}
	})
}

// A rewind never keeps a summary that stands in for a message it deletes.
// Agents' clocks need not agree: a message stamped ahead of its
// neighbours can be deleted by a cutoff that the condense's event and its
// summary (both stamped by the history's order) lie before. The condense is
// undone with it, and so is a later one whose summary hid its summary.
func TestRewindUndoesASummaryOfDeletedMessages(t *testing.T) {
	orig := msgs(16)
	orig[4].TS = 5000 // a user turn stamped ahead of the others
	p := schema.Profile{ID: "p", ContextWindow: 1000}
	plan, err := PlanCondense(orig, &p, "in")
	mustNoErr(t, err)
	h := plan.Finish("s", lenCount).History
	if orig[4].TS < 5000 || h[4].CondenseParent != plan.CondenseID {
		t.Fatalf("the test wants m4 hidden by the condense: %+v", h[4])
	}
	evs := []schema.ContextEventRef{{Type: schema.EventCondenseContext, ID: plan.CondenseID, TS: orig[11].TS}}
	rw, ok := PlanRewind(h, evs, 5000, false)
	if !ok || !slices.Contains(rw.RemovedCondenseIDs, plan.CondenseID) {
		t.Fatalf("ok %v, removed condenses %v", ok, rw.RemovedCondenseIDs)
	}
	want := slices.Delete(slices.Clone(orig), 4, 5)
	if !reflect.DeepEqual(rw.History, want) {
		t.Fatalf("history %q, want %q", join(rw.History), join(want))
	}
	// A second condense whose summary hid the first summary goes too.
	h2 := append(slices.Clone(h), textMsg(16, "x"), textMsg(17, "y"), textMsg(18, "z"), textMsg(19, "w"))
	plan2, err := PlanCondense(h2, &p, "in2")
	mustNoErr(t, err)
	h2 = plan2.Finish("s2", lenCount).History
	evs = append(evs, schema.ContextEventRef{Type: schema.EventCondenseContext, ID: plan2.CondenseID, TS: 1190})
	rw, ok = PlanRewind(h2, evs, 5000, false)
	if !ok || len(rw.RemovedCondenseIDs) != 2 {
		t.Fatalf("ok %v, removed condenses %v", ok, rw.RemovedCondenseIDs)
	}
	for _, m := range rw.History {
		if m.IsSummary || m.CondenseParent != "" {
			t.Fatalf("left %+v", m)
		}
	}
}

// A manual condense stamped by a UI clock behind the agents' turns: a
// rewind to one of the turns it summarized undoes it, restores the rest
// exactly, and its event says so.
func TestRewindUndoesACondenseStampedBehind(t *testing.T) {
	p := schema.Profile{ID: "p", ContextWindow: 100000, MaxTokens: 100}
	c := newConv(&fixedSummarizer{text: "s"}, p)
	ctx := context.Background()
	for i := range 12 {
		_, err := c.Append(ctx, turnOf(i, 10))
		mustNoErr(t, err)
	}
	orig := slices.Clone(c.Messages)
	evs, err := c.Apply(ctx, schema.Input{Kind: schema.KindCondense, ID: msgID(100), ConversationID: testConv, TS: 1005, Trigger: schema.TriggerManual})
	mustNoErr(t, err)
	cc, ok := evs[len(evs)-1].(*schema.CondenseContext)
	if !ok {
		t.Fatalf("condense: %v", types(evs))
	}
	evs, err = c.Apply(ctx, schema.Input{Kind: schema.KindRewind, ID: msgID(101), ConversationID: testConv, TS: orig[6].TS})
	mustNoErr(t, err)
	rw, ok := evs[len(evs)-1].(*schema.Rewind)
	if !ok || !slices.Equal(rw.RemovedCondenseIDs, []string{cc.CondenseID}) {
		t.Fatalf("rewind: %v %+v", types(evs), evs[len(evs)-1])
	}
	if !reflect.DeepEqual(c.Messages, orig[:6]) {
		t.Fatalf("history %q, want %q", join(c.Messages), join(orig[:6]))
	}
}

// A pinned truncation marker stays visible through the next truncation,
// which otherwise hides the older markers in its range: a pin that is
// accepted holds.
func TestTruncationKeepsAPinnedMarker(t *testing.T) {
	first, m := truncated(t, 20)
	marker := m.ID
	tagged := func(tr Truncation) bool {
		for _, m := range tr.History {
			if m.ID == marker {
				return m.TruncationParent != ""
			}
		}
		t.Fatal("the marker is gone")
		return false
	}
	again, ok := PlanTruncationKeeping(first.History, 0.9, "t2", nil, lenCount)
	if !ok || !tagged(again) {
		t.Fatalf("unpinned: ok %v, the older marker hidden %v; the test needs it in the range", ok, ok && tagged(again))
	}
	again, ok = PlanTruncationKeeping(first.History, 0.9, "t2", map[string]bool{marker: true}, lenCount)
	if !ok || tagged(again) {
		t.Fatalf("pinned: ok %v, the marker hidden %v", ok, ok && tagged(again))
	}
	if !slices.ContainsFunc(EffectiveHistory(again.History), func(m schema.Message) bool { return m.ID == marker }) {
		t.Fatal("the pinned marker left the effective history")
	}
}

// The rewind that undoes a condense restores as many messages as the
// condense said it condensed, a truncation marker it hid included.
func TestRewindRestoresWhatTheCondenseCondensed(t *testing.T) {
	tr, ok := PlanTruncation(msgs(16), 0.5, "t", lenCount)
	if !ok {
		t.Fatal("nothing truncated")
	}
	p := schema.Profile{ID: "p", ContextWindow: 1000}
	plan, err := PlanCondense(tr.History, &p, "in")
	mustNoErr(t, err)
	c := plan.Finish("summary", lenCount)
	hidMarker := false
	for _, m := range c.History {
		hidMarker = hidMarker || (m.IsTruncationMarker && m.CondenseParent == plan.CondenseID)
	}
	if !hidMarker {
		t.Fatal("the condense hid no marker: the test does not cover it")
	}
	last := tr.History[len(tr.History)-1].TS
	evs := []schema.ContextEventRef{{Type: schema.EventCondenseContext, ID: plan.CondenseID, TS: last}}
	rw, ok := PlanRewind(c.History, evs, last, true)
	if !ok || rw.MessagesRestored != c.MessagesCondensed || !reflect.DeepEqual(rw.History, tr.History) {
		t.Fatalf("ok %v: restored %d, condensed %d", ok, rw.MessagesRestored, c.MessagesCondensed)
	}
}

// Roo's race fix (#10113) in its own scenario: the UI row the user rewinds
// to was stamped before the assistant turn that precedes it in the
// history. The cutoff moves to the next user message, here the tool
// results, so the assistant turn is kept with its calls pending, as Roo
// keeps it; the agent sends the results again. A pending call here is
// Roo's behaviour, not a split exchange.
func TestRewindRaceAdjustmentKeepsTheCallPending(t *testing.T) {
	var h []schema.Message
	for _, tr := range []schema.Turn{turnOf(0, 5), turnOf(1, 5), turnOf(2, 5), callTurn(3, 5, "X"), resultTurn(4, "X"), turnOf(5, 5)} {
		h = append(h, schema.Message{Turn: tr, Tokens: 5})
	}
	rw, ok := PlanRewind(h, nil, 1025, false)
	if !ok || rw.CutoffTS != 1040 || join(rw.History) != "m0 m1 m2 m3" {
		t.Fatalf("cutoff %d history %q", rw.CutoffTS, join(rw.History))
	}
	if open := openToolUses(rw.History); !open["X"] {
		t.Fatalf("the call is not pending: %v", open)
	}
	// The agent answers the call again: the history is whole.
	if lost := lostResults(append(rw.History, schema.Message{Turn: resultTurn(6, "X")})); len(lost) > 0 {
		t.Fatalf("results %v dropped", lost)
	}
}

// A rewind lists every reduction it undoes, and undoes what stood on it
// (review of this session's changes):
//   - a reduction whose own summary or marker the cutoff deletes is undone,
//     and the event must say so, even when its event (stamped behind, by an
//     agent's overflow say) lies before the cutoff and nothing it hid is
//     deleted;
//   - a condense undone by its event alone (stamped ahead by a UI clock),
//     with no message deleted, takes the later condense that hid its
//     summary with it;
//   - a summary at the end shares the ts of the last turn, so a rewind to
//     the agent's next turn, a millisecond later, leaves the condense be.
func TestRewindListsAndCascadesEveryUndoneReduction(t *testing.T) {
	base := msgs(12)
	tr, m := truncated(t, len(base))
	markerTS := m.TS
	trEvs := []schema.ContextEventRef{{Type: schema.EventSlidingWindowTruncation, ID: "t1", TS: 1000}}
	rw, ok := PlanRewind(tr.History, trEvs, markerTS, false)
	var want []schema.Message // what is older than the marker, untagged
	for _, m := range base {
		if m.TS < markerTS {
			want = append(want, m)
		}
	}
	if !ok || !slices.Equal(rw.RemovedTruncationIDs, []string{"t1"}) || !reflect.DeepEqual(rw.History, want) {
		t.Fatalf("rewind to the marker's ts: ok %v, removed %v, history %q", ok, rw.RemovedTruncationIDs, join(rw.History))
	}

	p := schema.Profile{ID: "p", ContextWindow: 1000, Strategy: schema.StrategyFreshStart, KeepTask: boolp(false)}
	orig := msgs(6)
	plan, err := PlanCondense(orig, &p, "in")
	mustNoErr(t, err)
	c1 := plan.Finish("s1", lenCount)
	evs := []schema.ContextEventRef{{Type: schema.EventCondenseContext, ID: plan.CondenseID, TS: orig[5].TS}}
	next := append(slices.Clone(c1.History), textMsg(6, "next"))
	next[len(next)-1].TS = orig[5].TS + 1
	rw, ok = PlanRewind(next, evs, orig[5].TS+1, false)
	if !ok || len(rw.RemovedCondenseIDs) != 0 || !reflect.DeepEqual(rw.History, c1.History) {
		t.Fatalf("rewind to the next turn: ok %v, removed %v, history %q", ok, rw.RemovedCondenseIDs, join(rw.History))
	}

	// The first condense stamped ahead (9000); a second one hides its
	// summary; a rewind to 9000 deletes no message.
	evs[0].TS = 9000
	h := c1.History
	for i := 6; i < 10; i++ {
		h = append(h, textMsg(i, fmt.Sprintf("later %d", i)))
	}
	want = slices.Concat(orig, h[len(h)-4:])
	plan2, err := PlanCondense(h, &p, "in2")
	mustNoErr(t, err)
	h = plan2.Finish("s2", lenCount).History
	evs = append(evs, schema.ContextEventRef{Type: schema.EventCondenseContext, ID: plan2.CondenseID, TS: want[len(want)-1].TS})
	rw, ok = PlanRewind(h, evs, 9000, false)
	if !ok || len(rw.RemovedCondenseIDs) != 2 || !reflect.DeepEqual(rw.History, want) {
		t.Fatalf("cascade: ok %v, removed %v, history %q", ok, rw.RemovedCondenseIDs, join(rw.History))
	}
}

// preserve_fraction's summary and acknowledgement stay together (review):
// a truncation whose cut falls between them steps back to keep both, and
// pinning either keeps the other.
func TestSummaryAndAcknowledgementStayTogether(t *testing.T) {
	h := msgs(10)
	sum := schema.Message{Turn: schema.Turn{ID: msgID(100), ConversationID: testConv, TS: 1019, Role: schema.RoleUser,
		Content: schema.TextContent("snapshot")}, IsSummary: true, CondenseID: "c", Tokens: 8}
	ack := sum
	ack.ID, ack.Role, ack.IsSummaryAck, ack.Content = msgID(101), schema.RoleAssistant, true, schema.TextContent("ok")
	h = slices.Insert(h, 2, sum, ack) // m0 m1 S A m2 … m9
	// Twelve visible: floor(11 × 0.3) = 3, even 2: the cut would hide m1
	// and the summary and keep the acknowledgement first.
	tr, ok := PlanTruncation(h, 0.3, "t", lenCount)
	if !ok {
		t.Fatal("nothing truncated")
	}
	eff := EffectiveHistory(tr.History)
	for i, m := range eff {
		if m.IsSummaryAck && (i == 0 || !eff[i-1].IsCondenseSummary()) {
			t.Fatalf("the acknowledgement without its summary: %q", join(eff))
		}
	}
	for _, pinned := range []string{sum.ID, ack.ID} {
		keep := MustKeep(h, map[string]bool{pinned: true}, &schema.Profile{ID: "p", ContextWindow: 1000, KeepTask: boolp(false)})
		if !keep[sum.ID] || !keep[ack.ID] {
			t.Fatalf("pinned %s: kept %v", pinned, keep)
		}
	}
}

// truncated is msgs(n) truncated by half (truncation id "t1"), with its
// marker.
func truncated(t *testing.T, n int) (Truncation, schema.Message) {
	t.Helper()
	tr, ok := PlanTruncation(msgs(n), 0.5, "t1", lenCount)
	if !ok {
		t.Fatal("nothing truncated")
	}
	for _, m := range tr.History {
		if m.IsTruncationMarker {
			return tr, m
		}
	}
	t.Fatal("no marker")
	return tr, schema.Message{}
}

// The first visible message stays through a truncation; when an earlier
// reduction left an assistant call there, its results stay too (review:
// with skewed clocks and pins the call was left unanswered).
func TestTruncationKeepsTheFirstCallsResults(t *testing.T) {
	var h []schema.Message
	for _, tr := range []schema.Turn{callTurn(1, 5, "X"), resultTurn(2, "X")} {
		h = append(h, schema.Message{Turn: tr, Tokens: 5})
	}
	for i := 3; i < 12; i++ {
		h = append(h, textMsg(i, fmt.Sprintf("message %d", i)))
	}
	tr, ok := PlanTruncation(h, 0.5, "t", lenCount)
	if !ok {
		t.Fatal("nothing truncated")
	}
	eff := EffectiveHistory(tr.History)
	answered := map[string]bool{}
	for _, m := range eff {
		for _, b := range m.Content.Blocks {
			if b.Type == schema.BlockToolResult {
				answered[b.ToolUseID] = true
			}
		}
	}
	if eff[0].ID != h[0].ID || !answered["X"] {
		t.Fatalf("the first message's call is left without its result: %q", join(eff))
	}
}
