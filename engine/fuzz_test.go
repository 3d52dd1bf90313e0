package engine

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/ctxpipe/ctxpipe/schema"
)

// FuzzEngine drives a conversation with an arbitrary sequence of turns (with
// tool calls and results), manual condenses, overflows, rewinds and
// summarizer behaviours, and checks the invariants after every step:
//   - the effective history never holds a tool_result without its tool_use,
//     and never drops a stored result that no tag hides (a reduction never
//     hides a call whose results are kept or still to come);
//   - effective ⊆ stored, and the stored agent messages are exactly the ones
//     appended and not rewound (nothing is lost, nothing appears);
//   - every parent tag that hides a message names a stored summary or marker;
//   - what must survive (MustKeep: pinned messages, the task, the latest
//     instruction) before a turn, condense or overflow is still visible, as
//     stored, after it; a stand-in never stands for a kept message;
//   - at the end, rewinding past every condensation, truncation and masking
//     restores the original history, and so the original effective
//     history, byte for byte.
//
// ops[0] picks the strategy, whether the profile masks (and how many results
// it keeps whole) and whether it keeps the task.
func FuzzEngine(f *testing.F) {
	f.Add([]byte{0, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1})
	f.Add([]byte{1, 2, 9, 3, 9, 2, 9, 3, 9, 2, 9, 3, 9, 4, 0, 2, 9, 3, 9, 5, 0, 6, 3})
	f.Add([]byte{2, 7, 1, 2, 200, 3, 200, 2, 200, 3, 200, 2, 200, 3, 200, 6, 1, 2, 5, 3, 5})
	f.Add([]byte{0, 7, 2, 0, 250, 1, 250, 0, 250, 1, 250, 0, 250, 1, 250, 0, 250, 1, 250, 5, 0, 4, 0, 6, 9})
	f.Add([]byte(strings.Repeat("\x02\x40\x03\x40", 30) + "\x04\x00\x05\x00\x06\x07"))
	// Masking profiles (ops[0] 3, 10, 22), with pins (op 8), large results
	// and a final rewind.
	f.Add([]byte("\x03" + strings.Repeat("\x03\x70\x02\x77", 12) + "\x08\x01\x01" + strings.Repeat("\x03\x70\x02\x77", 8) + "\x04\x00\x06\x05\x01"))
	f.Add([]byte("\x0a" + strings.Repeat("\x03\x71\x02\x76\x00\x10", 10) + "\x08\x00\x02\x05\x00"))
	f.Add([]byte("\x16" + strings.Repeat("\x03\x72\x02\x75", 20) + "\x08\x03\x01\x04\x00"))
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) < 2 || len(ops) > 400 {
			return
		}
		p := schema.Profile{ID: "fz", ContextWindow: 2000, MaxTokens: 200,
			Strategy: []schema.Strategy{schema.StrategyKeepTail, schema.StrategyFreshStart, schema.StrategyPreserveFraction}[int(ops[0])%3]}
		if ops[0]/3%2 == 1 {
			p.Mask = schema.MaskSettings{Enabled: true, KeepLast: intp(int(ops[0]) / 6 % 3), MinGainTokens: intp(int(ops[0]) / 18 % 2 * 50)}
		}
		if ops[0]/36%2 == 1 {
			p.KeepTask = boolp(false)
		}
		mode := 0 // 0 short summary, 1 too long, 2 error
		sum := SummarizerFunc(func(_ context.Context, req schema.SummaryRequest) (schema.Summary, error) {
			switch mode {
			case 1:
				return schema.Summary{Text: strings.Repeat("long ", 3000)}, nil
			case 2:
				return schema.Summary{}, errors.New("unavailable")
			}
			return schema.Summary{Text: fmt.Sprintf("summary of %d", len(req.Messages))}, nil
		})
		c := newConv(sum, p)
		ctx := context.Background()
		originals := map[string]schema.Message{} // appended and not rewound, as first stored
		var order []string
		ts, n := int64(1000), 0
		next := func(i *int) byte {
			if *i+1 < len(ops) {
				*i++
				return ops[*i]
			}
			return 0
		}
		for i := 1; i < len(ops); i++ {
			op := ops[i] % 9
			// What must survive this step: computed before it, with the
			// step's turn appended (it may be the new latest instruction).
			mustSurvive := func(extra ...schema.Message) map[string]bool {
				return MustKeep(append(c.Messages[:len(c.Messages):len(c.Messages)], extra...), c.State.Pins, &c.Profile)
			}
			var required map[string]bool
			switch op {
			case 0, 1, 2, 3:
				size := 1 + int(next(&i))%120
				ts += 10
				n++
				turn := schema.Turn{ID: msgID(n), ConversationID: testConv, TS: ts, Content: schema.TextContent(strings.Repeat("tok ", size))}
				open := c.State.LastToolUseIDs
				switch {
				case op%2 == 1:
					turn.Role = schema.RoleAssistant
					if op == 3 { // one to three parallel calls
						blocks := []schema.Block{{Type: schema.BlockText, Text: "calling"}}
						for k := 0; k <= size%3; k++ {
							blocks = append(blocks, toolUse(fmt.Sprintf("call_%d_%d", n, k), "bash", fmt.Sprintf(`{"cmd":"ls %d"}`, size)))
						}
						turn.Content = schema.BlockContent(blocks...)
					}
				case len(open) > 0:
					// Every result in one turn (Anthropic), or one turn per
					// call (OpenAI's tool messages).
					turn.Role = schema.RoleUser
					if size%2 == 1 {
						open = open[:1]
					}
					var blocks []schema.Block
					for _, id := range open {
						blocks = append(blocks, toolResult(id, strings.Repeat("out ", size)))
					}
					turn.Content = schema.BlockContent(blocks...)
				default:
					turn.Role = schema.RoleUser
				}
				required = mustSurvive(schema.Message{Turn: turn})
				delete(required, turn.ID)
				if _, err := c.Append(ctx, turn); err != nil {
					t.Fatalf("append: %v", err)
				}
				m := schema.Message{Turn: turn}
				for _, s := range c.Messages {
					if s.ID == turn.ID {
						m.Tokens = s.Tokens
					}
				}
				originals[turn.ID] = m
				order = append(order, turn.ID)
			case 4:
				ts++
				required = mustSurvive()
				control(t, c, schema.Input{Kind: schema.KindCondense, ID: msgID(100000 + i), ConversationID: testConv, TS: lastTS(c), Trigger: schema.TriggerManual})
			case 5:
				required = mustSurvive()
				control(t, c, schema.Input{Kind: schema.KindOverflow, ID: msgID(200000 + i), ConversationID: testConv, TS: lastTS(c), Trigger: schema.TriggerForced})
			case 6:
				if len(order) == 0 {
					continue
				}
				target := originals[order[int(next(&i))%len(order)]]
				include := next(&i)%2 == 1
				_, err := c.Apply(ctx, schema.Input{Kind: schema.KindRewind, ID: msgID(300000 + i), ConversationID: testConv, TS: target.TS, IncludeTarget: include})
				if err != nil && schema.ReasonOf(err) != schema.ReasonUnknownTarget {
					t.Fatalf("rewind: %v", err)
				}
				order = dropRewound(order, originals, target.TS, include)
			case 7:
				mode = int(next(&i)) % 3
			case 8:
				if len(order) == 0 {
					continue
				}
				target := order[int(next(&i))%len(order)]
				ts++
				_, err := c.Apply(ctx, schema.Input{Kind: schema.KindPin, ID: msgID(400000 + i), ConversationID: testConv, TS: ts, MessageID: target, Pinned: next(&i)%3 != 0})
				if err != nil {
					t.Fatalf("pin: %v", err)
				}
			}
			checkInvariants(t, c, originals, order)
			eff := idSet(c.Effective())
			for id := range required {
				if !eff[id] && idSet(c.Messages)[id] {
					t.Fatalf("op %d: message %s must survive but is hidden\nstored %q\neffective %q", op, id, join(c.Messages), join(c.Effective()))
				}
			}
		}
		// Rewind past every condensation and truncation that is still live.
		cut := int64(-1)
		for _, m := range c.Messages {
			if m.IsMask() && (cut < 0 || m.MaskedAt < cut) {
				cut = m.MaskedAt
			}
		}
		for _, r := range ContextEventRefs(c.Events) {
			live := false
			for _, m := range c.Messages {
				if (m.IsSummary && m.CondenseID == r.ID) || (m.IsTruncationMarker && m.TruncationID == r.ID) {
					live = true
				}
			}
			if live && (cut < 0 || r.TS < cut) {
				cut = r.TS
			}
		}
		if cut < 0 {
			return
		}
		if _, err := c.Apply(ctx, schema.Input{Kind: schema.KindRewind, ID: msgID(999999), ConversationID: testConv, TS: cut}); err != nil {
			t.Fatalf("final rewind: %v", err)
		}
		order = dropRewound(order, originals, cut, false)
		var want []schema.Message
		for _, id := range order {
			want = append(want, originals[id])
		}
		if len(c.Messages)+len(want) > 0 && !reflect.DeepEqual(c.Messages, want) {
			// (Pins live in the state, never in a stored message.)
			t.Fatalf("rewind past every condensation: stored history not restored\n got %v\nwant %d messages", join(c.Messages), len(want))
		}
		if eff := c.Effective(); len(eff)+len(want) > 0 && !reflect.DeepEqual(eff, EffectiveHistory(want)) {
			t.Fatal("effective history not restored")
		}
	})
}

// control applies a condense or overflow: accepted on a conversation with
// stored turns, rejected with unknown_conversation (and nothing changed) on
// one without.
func control(t *testing.T, c *Conversation, in schema.Input) {
	t.Helper()
	empty, before := len(c.Messages) == 0, c.State
	_, err := c.Apply(context.Background(), in)
	switch {
	case empty && (schema.ReasonOf(err) != schema.ReasonUnknownConversation || !reflect.DeepEqual(c.State, before)):
		t.Fatalf("%s on an empty conversation: %v, state %+v", in.Kind, err, c.State)
	case !empty && err != nil:
		t.Fatalf("%s: %v", in.Kind, err)
	}
}

func lastTS(c *Conversation) int64 {
	var ts int64
	for _, m := range c.Messages {
		if !m.Synthetic() && m.TS > ts {
			ts = m.TS
		}
	}
	if ts == 0 {
		ts = 1
	}
	return ts
}

// dropRewound removes the turns a rewind to cutoff deletes (the fuzz turns
// have distinct ts, so the cutoff always matches one exactly).
func dropRewound(order []string, originals map[string]schema.Message, cutoff int64, include bool) []string {
	kept := order[:0]
	for _, id := range order {
		m := originals[id]
		if m.TS < cutoff || (include && m.TS == cutoff) {
			kept = append(kept, id)
			continue
		}
		delete(originals, id)
	}
	return kept
}

func checkInvariants(t *testing.T, c *Conversation, originals map[string]schema.Message, order []string) {
	t.Helper()
	stored := idSet(c.Messages)
	eff := c.Effective()
	uses := map[string]bool{}
	for _, m := range eff {
		if !stored[m.ID] {
			t.Fatalf("effective message %s is not stored", m.ID)
		}
		for _, b := range m.Content.Blocks {
			switch b.Type {
			case schema.BlockToolUse:
				uses[b.ID] = true
			case schema.BlockToolResult:
				if !uses[b.ToolUseID] {
					t.Fatalf("effective history has a tool_result %s without its tool_use", b.ToolUseID)
				}
			}
		}
	}
	if lost := lostResults(c.Messages); len(lost) > 0 {
		t.Fatalf("tool results dropped from the effective history: %v\nstored %q\neffective %q", lost, join(c.Messages), join(eff))
	}
	var agent []string
	summaries, markers := liveIDs(c.Messages)
	for _, m := range c.Messages {
		if !m.Synthetic() {
			agent = append(agent, m.ID)
		}
		if m.CondenseParent != "" && !summaries[m.CondenseParent] {
			// Allowed only until a cleanup; the engine cleans up on rewind,
			// and condense/truncation only point at what they insert.
			t.Fatalf("message %s names a missing summary", m.ID)
		}
		if m.TruncationParent != "" && !markers[m.TruncationParent] {
			t.Fatalf("message %s names a missing marker", m.ID)
		}
	}
	if !reflect.DeepEqual(agent, append([]string(nil), order...)) && !(len(agent) == 0 && len(order) == 0) {
		t.Fatalf("stored agent messages %d, appended and not rewound %d", len(agent), len(order))
	}
	for _, id := range order {
		if !stored[id] {
			t.Fatalf("message %s was lost", id)
		}
	}
}
