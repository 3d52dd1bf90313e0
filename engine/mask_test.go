package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/textfacts"
	"github.com/ctxpipe/ctxpipe/tokens"
)

// agentTurns is an agent run: the task (m0), then exchanges of a call (odd
// turns) and its result (even turns) of resultTokens tokens each; the calls
// alternate between reading a file and running a command.
func agentTurns(exchanges, resultTokens int) []schema.Turn {
	turns := []schema.Turn{turnOf(0, 20)}
	for k := 0; k < exchanges; k++ {
		i := 1 + 2*k
		id := fmt.Sprintf("call%d", k)
		call := turnOf(i, 5)
		input := fmt.Sprintf(`{"path":"src/file%d.go"}`, k)
		name := "read_file"
		if k%2 == 1 {
			name, input = "bash", fmt.Sprintf(`{"command":"go test ./pkg%d/... && echo <done>"}`, k)
		}
		call.Content = schema.BlockContent(schema.Block{Type: schema.BlockText, Text: "next"}, toolUse(id, name, input))
		res := turnOf(i+1, 0)
		out := strings.Repeat("outputs\n", resultTokens/2) + fmt.Sprintf("FAILED TestX%d: ValueError: bad %d", k, k)
		res.Content = schema.BlockContent(toolResult(id, out))
		turns = append(turns, call, res)
	}
	return turns
}

func appendAll(t *testing.T, c *Conversation, turns []schema.Turn) []schema.Event {
	t.Helper()
	var evs []schema.Event
	for _, tr := range turns {
		e, err := c.Append(context.Background(), tr)
		mustNoErr(t, err)
		evs = append(evs, e...)
	}
	return evs
}

func historyOf(t *testing.T, turns []schema.Turn) []schema.Message {
	t.Helper()
	c := newConv(&fixedSummarizer{text: "s"}, schema.Profile{ID: "big", ContextWindow: 1 << 20})
	appendAll(t, c, turns)
	return c.Messages
}

// charCount is the engine tests' counter (4 characters a token, no fudge).
var charCount = tokens.Counter{Text: tokens.Chars{}, Fudge: 1}.Content

func TestPlanMask(t *testing.T) {
	h := historyOf(t, agentTurns(5, 400)) // results at m2 m4 m6 m8 m10
	pinned := historyOf(t, agentTurns(5, 400))
	pinned[4].Pinned = true
	tests := []struct {
		name   string
		msgs   []schema.Message
		o      MaskOptions
		masked string // the effective history after
	}{
		{"keep the last three", h, MaskOptions{KeepLast: 3}, "m0 m1 M2 m3 M4 m5 m6 m7 m8 m9 m10"},
		{"keep none", h, MaskOptions{KeepLast: 0}, "m0 m1 M2 m3 M4 m5 M6 m7 M8 m9 M10"},
		{"keep more than there are", h, MaskOptions{KeepLast: 9}, ""},
		{"excluded tool", h, MaskOptions{KeepLast: 1, ExcludeTools: []string{"read_file"}}, "m0 m1 m2 m3 M4 m5 m6 m7 M8 m9 m10"},
		{"kept message", h, MaskOptions{KeepLast: 1, Keep: map[string]bool{msgID(4): true}}, "m0 m1 M2 m3 m4 m5 M6 m7 M8 m9 m10"},
		{"small results stay", historyOf(t, agentTurns(5, 4)), MaskOptions{KeepLast: 0}, ""},
		{"pinned flag is the caller's to pass", pinned, MaskOptions{KeepLast: 3}, "m0 m1 M2 m3 M4 m5 m6 m7 m8 m9 m10"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, ok := PlanMask(tt.msgs, tt.o, "mask-1", 5000, charCount)
			if !ok {
				if tt.masked != "" {
					t.Fatalf("nothing masked, want %q", tt.masked)
				}
				return
			}
			if tt.masked == "" {
				t.Fatalf("masked %q, want nothing", join(EffectiveHistory(m.History)))
			}
			eff := EffectiveHistory(m.History)
			if got := join(eff); got != tt.masked {
				t.Fatalf("effective %q, want %q", got, tt.masked)
			}
			// The store replays the same Changes: inserts and tags only.
			if got := Apply(tt.msgs, &m.Changes); !reflect.DeepEqual(got, m.History) {
				t.Fatalf("Apply(changes) %q, planned %q", join(got), join(m.History))
			}
			if len(m.Changes.Delete) != 0 || m.Count != strings.Count(tt.masked, "M") || m.Messages != m.Count {
				t.Fatalf("changes %+v, count %d, messages %d", m.Changes.Delete, m.Count, m.Messages)
			}
			if lost := lostResults(m.History); len(lost) > 0 {
				t.Fatalf("results dropped: %v", lost)
			}
			for _, e := range eff {
				if !e.IsMask() {
					continue
				}
				if e.MaskedAt != 5000 || e.CondenseID != "mask-1" || !e.IsSummary || e.Tokens != charCount(e.Content) {
					t.Fatalf("stand-in %+v", e)
				}
				text := e.Content.Blocks[0].Content.Text
				k := (e.TS-1000)/10/2 - 1
				want := fmt.Sprintf(`read_file path="src/file%d.go"; `, k)
				if k%2 == 1 {
					want = fmt.Sprintf(`bash command="go test ./pkg%d/... && echo <done>"; `, k)
				}
				if !strings.HasPrefix(text, textfacts.MaskPrefix+want) || !strings.Contains(text, "tokens, 201 lines hidden") ||
					!strings.Contains(text, fmt.Sprintf("; last error: FAILED TestX%d: ValueError: bad %d.", k, k)) || strings.Contains(text, "\n") {
					t.Fatalf("stand-in %q", text)
				}
			}
			// Masking again masks nothing new: stand-ins are not masked twice.
			if again, ok := PlanMask(m.History, tt.o, "mask-2", 6000, charCount); ok {
				t.Fatalf("masked again: %q", join(EffectiveHistory(again.History)))
			}
		})
	}
}

// maskProfile masks, keeping the last result, in a 10,000-token window:
// the threshold is 7,500 tokens (75 %), 8,900 are allowed, and masking
// alone must bring an automatic reduction to 1,875 (MaskStopFraction).
func maskProfile(strategy schema.Strategy, auto bool) schema.Profile {
	return schema.Profile{ID: "m", ContextWindow: 10000, MaxTokens: 100, AutoCondense: &auto, Strategy: strategy,
		MinGainTokens: intp(0), Mask: schema.MaskSettings{Enabled: true, KeepLast: intp(1)}}
}

func TestEngineMasksBeforeCondensing(t *testing.T) {
	tests := []struct {
		name      string
		p         schema.Profile
		turns     []schema.Turn
		events    []schema.EventType // of the last turn
		summaries int                // summarizer calls
	}{
		{"masking is enough: no model call", maskProfile(schema.StrategyKeepTail, true), agentTurns(9, 850),
			[]schema.EventType{schema.EventToolResultsMasked}, 0},
		{"masking is not enough: condense the masked history", maskProfile(schema.StrategyKeepTail, true),
			append(agentTurns(8, 850), turnOf(17, 300), turnOf(18, 8000)),
			[]schema.EventType{schema.EventToolResultsMasked, schema.EventContextManaging, schema.EventCondenseContext}, 1},
		{"mask only: no condense, then truncation", maskProfile(schema.StrategyKeepTail, false),
			append(agentTurns(8, 850), turnOf(17, 300), turnOf(18, 8000)),
			[]schema.EventType{schema.EventToolResultsMasked, schema.EventSlidingWindowTruncation}, 0},
		{"below the minimum gain: condense as before", func() schema.Profile {
			p := maskProfile(schema.StrategyKeepTail, true)
			p.Mask.MinGainTokens = intp(100000)
			return p
		}(), agentTurns(9, 850), []schema.EventType{schema.EventContextManaging, schema.EventCondenseContext}, 1},
		{"masking off", func() schema.Profile {
			p := maskProfile(schema.StrategyKeepTail, true)
			p.Mask.Enabled = false
			return p
		}(), agentTurns(9, 850), []schema.EventType{schema.EventContextManaging, schema.EventCondenseContext}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sum := &fixedSummarizer{text: "summary"}
			c := newConv(sum, tt.p)
			appendAll(t, c, tt.turns[:len(tt.turns)-1])
			if len(c.Events) != 0 {
				t.Fatalf("early events %v", types(c.Events))
			}
			evs, err := c.Append(context.Background(), tt.turns[len(tt.turns)-1])
			mustNoErr(t, err)
			if got := types(evs); !reflect.DeepEqual(got, tt.events) {
				t.Fatalf("events %v, want %v (effective %q)", got, tt.events, join(c.Effective()))
			}
			if len(sum.requests) != tt.summaries {
				t.Fatalf("%d summarizer calls, want %d", len(sum.requests), tt.summaries)
			}
			if lost := lostResults(c.Messages); len(lost) > 0 {
				t.Fatalf("results dropped: %v", lost)
			}
			if m, ok := evs[0].(*schema.ToolResultsMasked); ok {
				last := tt.turns[len(tt.turns)-1]
				if m.MaskID != DeriveID(last.ID, "mask") || m.Count == 0 || m.NewContextTokens >= m.PrevContextTokens || m.Trigger != schema.TriggerAuto {
					t.Fatalf("event %+v", m)
				}
				if len(evs) == 1 && c.State.ContextTokens != m.NewContextTokens {
					t.Fatalf("state %d tokens, event %d", c.State.ContextTokens, m.NewContextTokens)
				}
			}
			for _, req := range sum.requests {
				// The summarizer reads stand-ins, not the bodies.
				for _, m := range req.Messages {
					for _, b := range m.Content.Blocks {
						if tt.p.Mask.Enabled && b.Type == schema.BlockToolResult && strings.Contains(b.Content.Text, "outputs\n") {
							t.Fatalf("the summarizer got a tool result whole: %.80q", b.Content.Text)
						}
					}
				}
			}
		})
	}
}

// A masking is undone by a rewind to its input, like a condense: the stored
// originals come back exactly.
func TestRewindUndoesMasking(t *testing.T) {
	c := newConv(&fixedSummarizer{text: "s"}, maskProfile(schema.StrategyKeepTail, true))
	turns := agentTurns(9, 850)
	appendAll(t, c, turns[:len(turns)-1])
	before := append([]schema.Message(nil), c.Messages...)
	evs := appendAll(t, c, turns[len(turns)-1:])
	if got := types(evs); !reflect.DeepEqual(got, []schema.EventType{schema.EventToolResultsMasked}) {
		t.Fatalf("events %v", got)
	}
	last := turns[len(turns)-1]
	evs, err := c.Apply(context.Background(), schema.Input{Kind: schema.KindRewind, ID: msgID(777), ConversationID: testConv, TS: last.TS, IncludeTarget: true})
	mustNoErr(t, err)
	rw := evs[0].(*schema.Rewind)
	mask := DeriveID(last.ID, "mask")
	if !reflect.DeepEqual(rw.RemovedMaskIDs, []string{mask}) || rw.MessagesRemoved != 0 || rw.MessagesRestored == 0 {
		t.Fatalf("rewind %+v", rw)
	}
	want := append(before, c.Messages[len(c.Messages)-1])
	if !reflect.DeepEqual(c.Messages, want) {
		t.Fatalf("stored %q, want %q", join(c.Messages), join(want))
	}
	if c.State.ContextTokens != effectiveTokens(c.State.SystemTokens, want) {
		t.Fatalf("context %d", c.State.ContextTokens)
	}
}

// Masking waits for pending results, as every reduction does.
func TestMaskingWaitsForResults(t *testing.T) {
	c := newConv(&fixedSummarizer{text: "s"}, maskProfile(schema.StrategyKeepTail, true))
	turns := agentTurns(9, 850)
	turns[len(turns)-2].Content.Blocks[0].Text = strings.Repeat("word", 1000) // over the threshold
	appendAll(t, c, turns[:len(turns)-2])
	evs := appendAll(t, c, turns[len(turns)-2:len(turns)-1]) // the call
	if len(evs) != 0 {
		t.Fatalf("reduced while a call waits for its result: %v", types(evs))
	}
	if evs := appendAll(t, c, turns[len(turns)-1:]); len(evs) == 0 {
		t.Fatal("no reduction once the result arrived")
	}
}

// The condensers recognize a stand-in by its prefix and read back the
// error line it kept.
func TestStandInReadByTheCondensers(t *testing.T) {
	s := standIn(toolUse("c0", "bash", `{"command":"make"}`), true, "ok\nmake: *** [all] Error 2\n", true, 12)
	if !strings.HasPrefix(s, textfacts.MaskPrefix) {
		t.Fatalf("stand-in %q does not open with textfacts.MaskPrefix", s)
	}
	if got, want := textfacts.LastErrorLine(s), "make: *** [all] Error 2"; got != want {
		t.Errorf("LastErrorLine(%q) = %q, want %q", s, got, want)
	}
	if got, want := textfacts.FailureLine(s), "make: *** [all] Error 2"; got != want {
		t.Errorf("FailureLine(%q) = %q, want %q", s, got, want)
	}
}

// The summarizer of a masking profile reads every tool result as a short
// stand-in (the call is right before it) and long tool inputs clipped to
// their first line; the stored history is untouched.
func TestMaskRequest(t *testing.T) {
	heredoc := `{"command":"cat <<'EOF' > /testbed/repro.py\n` + strings.Repeat("print(1)\\n", 100) + `EOF"}`
	full := standIn(toolUse("c0", "bash", `{"command":"make"}`), true, "ok\nmake: *** [all] Error 2\n", false, 12)
	h := []schema.Message{
		textMsg(0, "task"),
		{Turn: schema.Turn{ID: msgID(1), Role: schema.RoleAssistant, Content: schema.BlockContent(
			toolUse("c0", "bash", `{"command":"make"}`), toolUse("c1", "bash", heredoc), toolUse("c2", "bash", `{"command":"ls"}`))}},
		{Turn: schema.Turn{ID: msgID(2), Role: schema.RoleUser, Content: schema.BlockContent(
			toolResult("c0", full), toolResult("c1", strings.Repeat("x\n", 300)+"FAILED: boom"), toolResult("c2", "a.go"))}},
	}
	got := maskRequest(h, h)
	if reflect.DeepEqual(got, h) || !reflect.DeepEqual(h[2].Content.Blocks[0].Content.Text, full) {
		t.Fatal("maskRequest changed nothing, or changed the stored history")
	}
	in := string(got[1].Content.Blocks[1].Input)
	if !strings.Contains(in, `cat <<'EOF' > /testbed/repro.py [ctxpipe left out`) || len(in) > 300 || !json.Valid([]byte(in)) {
		t.Errorf("clipped input %s", in)
	}
	if s := string(got[1].Content.Blocks[0].Input); s != `{"command":"make"}` {
		t.Errorf("short input changed: %s", s)
	}
	want := []string{
		textfacts.MaskPrefix + "2 lines; last error: make: *** [all] Error 2. Run the call again to see it.]",
		textfacts.MaskPrefix + "301 lines; last error: FAILED: boom. Run the call again to see it.]",
		"a.go",
	}
	for i, w := range want {
		if g := got[2].Content.Blocks[i].Content.Text; g != w {
			t.Errorf("result %d = %q, want %q", i, g, w)
		}
	}
}

// A truncation marker names the files the hidden messages touched and
// their last error lines, so a truncation does not drop them unseen.
func TestTruncationMarkerCarriesFacts(t *testing.T) {
	h := historyOf(t, agentTurns(6, 40))
	tr, ok := PlanTruncation(h, 0.5, "t1", charCount)
	if !ok {
		t.Fatal("nothing truncated")
	}
	var marker schema.Message
	for _, m := range tr.History {
		if m.IsTruncationMarker {
			marker = m
		}
	}
	want := TruncationMarkerText(tr.Removed) +
		"\nFiles the hidden messages touched: src/file0.go (read), pkg1/ (read), src/file2.go (read)" +
		"\nAn error in the hidden messages: FAILED TestX1: ValueError: bad 1" +
		"\nAn error in the hidden messages: FAILED TestX2: ValueError: bad 2"
	if marker.Content.Text != want || marker.Tokens != charCount(marker.Content) {
		t.Fatalf("marker %q (%d tokens), want %q", marker.Content.Text, marker.Tokens, want)
	}
}

// A truncation that hides an older marker lists the files that marker
// listed: the messages behind it touched them too.
func TestTruncationMarkerCarriesOlderMarkersFiles(t *testing.T) {
	h := historyOf(t, agentTurns(10, 40))
	first, ok := PlanTruncation(h, 0.5, "t1", charCount)
	if !ok {
		t.Fatal("nothing truncated")
	}
	second, ok := PlanTruncation(first.History, 0.5, "t2", charCount)
	if !ok {
		t.Fatal("nothing truncated the second time")
	}
	var marker schema.Message
	for _, m := range EffectiveHistory(second.History) {
		if m.IsTruncationMarker {
			marker = m
		}
	}
	if marker.TruncationID != "t2" {
		t.Fatalf("the effective history's marker is %q, want t2's (t1's is hidden)", marker.TruncationID)
	}
	for _, f := range []string{"src/file0.go (read)", "pkg1/ (read)", "src/file2.go (read)", "pkg3/ (read)", "src/file4.go (read)"} {
		if !strings.Contains(marker.Content.Text, f) {
			t.Errorf("marker %q does not name %s", marker.Content.Text, f)
		}
	}
}

// A profile that masks sends the summarizer clipped tool inputs, and the
// request's Source the whole ones: the files-touched list is taken from
// Source, so a file named at the end of a long command stays listed.
func TestMaskedCondenseSourceKeepsWholeInputs(t *testing.T) {
	turns := agentTurns(8, 40)
	long := "cat > fix.py << 'EOF'\\n" + strings.Repeat("x = 1\\n", 200) + "EOF\\nmv lib/new.py lib/old.py"
	turns[3].Content.Blocks[1] = toolUse("call1", "bash", `{"command":"`+long+`"}`)
	h := historyOf(t, turns)
	for _, s := range []schema.Strategy{schema.StrategyKeepTail, schema.StrategyFreshStart, schema.StrategyPreserveFraction} {
		t.Run(string(s), func(t *testing.T) {
			p := &schema.Profile{ID: "p", ContextWindow: 1 << 20, Strategy: s}
			plan, err := PlanCondenseWith(h, p, "in", CondenseOptions{Keep: MustKeep(h, nil, p), MaskResults: true})
			mustNoErr(t, err)
			named := func(msgs []schema.Message) bool {
				return slices.ContainsFunc(textfacts.FilesTouched(msgs), func(f textfacts.FileTouch) bool { return f.Path == "lib/old.py" })
			}
			if named(plan.Request.Messages) {
				t.Fatal("the masked request holds the whole command: the test no longer tests Source")
			}
			if !named(plan.Request.Source) {
				t.Fatalf("Source lost lib/old.py: %v", textfacts.FilesTouched(plan.Request.Source))
			}
		})
	}
}
