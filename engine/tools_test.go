package engine

import (
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/ctxpipe/ctxpipe/internal/transcripts"
	"github.com/ctxpipe/ctxpipe/schema"
)

// Tool calls and results across every reduction: a result the agent sent
// must reach the model as long as the message holding it is not hidden.

const transcriptDir = "../../shared/data/transcripts"

// lostResults lists the tool_result ids of stored messages that are not
// hidden by a tag, yet are missing from the effective history: results the
// effective history dropped as orphans because their call was hidden.
func lostResults(msgs []schema.Message) []string {
	summaries, markers := liveIDs(msgs)
	inEff := map[string]bool{}
	for _, m := range EffectiveHistory(msgs) {
		for _, b := range m.Content.Blocks {
			if b.Type == schema.BlockToolResult {
				inEff[m.ID+"/"+b.ToolUseID] = true
			}
		}
	}
	var lost []string
	for i := range msgs {
		m := &msgs[i]
		if hidden(m, summaries, markers) {
			continue
		}
		for _, b := range m.Content.Blocks {
			if b.Type == schema.BlockToolResult && !inEff[m.ID+"/"+b.ToolUseID] {
				lost = append(lost, b.ToolUseID)
			}
		}
	}
	return lost
}

func callTurn(i, tokens int, callIDs ...string) schema.Turn {
	t := turnOf(i, tokens)
	t.Role = schema.RoleAssistant
	blocks := []schema.Block{{Type: schema.BlockText, Text: strings.Repeat("word", tokens)}}
	for _, id := range callIDs {
		blocks = append(blocks, toolUse(id, "bash", fmt.Sprintf(`{"command":"run %s"}`, id)))
	}
	t.Content = schema.BlockContent(blocks...)
	return t
}

func resultTurn(i int, callIDs ...string) schema.Turn {
	t := turnOf(i, 0)
	t.Role = schema.RoleUser
	var blocks []schema.Block
	for _, id := range callIDs {
		blocks = append(blocks, toolResult(id, "output of "+id))
	}
	t.Content = schema.BlockContent(blocks...)
	return t
}

func toolUseIDs(c schema.Content) []string {
	var out []string
	for _, b := range c.Blocks {
		if b.Type == schema.BlockToolUse {
			out = append(out, b.ID)
		}
	}
	return out
}

// TestKeepTailCarriesEveryAnsweredCall: an OpenAI-style agent answers
// parallel calls with one result turn each, so the cut can fall between the
// result turns, however far after the call. Every call whose result stays in
// the kept tail goes into the summary.
func TestKeepTailCarriesEveryAnsweredCall(t *testing.T) {
	cases := []struct {
		name    string
		turns   int      // turns appended before the condense
		carried []string // tool_use ids the summary must carry
	}{
		{"cut at the first result", 9, []string{"A", "B", "C"}},
		{"cut at the second result", 10, []string{"B", "C"}},
		{"cut at the third result, three turns after the call", 11, []string{"C"}},
		{"cut after every result", 12, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := schema.Profile{ID: "big", ContextWindow: 1 << 20}
			c := newConv(&fixedSummarizer{text: "summary"}, p)
			ctx := context.Background()
			all := []schema.Turn{
				turnOf(0, 10), turnOf(1, 10), turnOf(2, 10), turnOf(3, 10), turnOf(4, 10),
				callTurn(5, 10, "A", "B", "C"), resultTurn(6, "A"), resultTurn(7, "B"), resultTurn(8, "C"),
				turnOf(9, 10), turnOf(10, 10), turnOf(11, 10),
			}
			for _, tr := range all[:tc.turns] {
				_, err := c.Append(ctx, tr)
				mustNoErr(t, err)
			}
			evs, err := c.Apply(ctx, schema.Input{Kind: schema.KindCondense, ID: msgID(900), ConversationID: testConv, TS: 5000, Trigger: schema.TriggerManual})
			mustNoErr(t, err)
			if got := types(evs); !reflect.DeepEqual(got, []schema.EventType{schema.EventContextManaging, schema.EventCondenseContext}) {
				t.Fatalf("events %v", got)
			}
			if lost := lostResults(c.Messages); len(lost) > 0 {
				t.Fatalf("tool results dropped from the effective history: %v (effective %q)", lost, join(c.Effective()))
			}
			var sum schema.Message
			for _, m := range c.Messages {
				if m.IsSummary {
					sum = m
				}
			}
			if got := toolUseIDs(sum.Content); !reflect.DeepEqual(got, tc.carried) {
				t.Fatalf("summary carries %v, want %v", got, tc.carried)
			}
		})
	}
}

// TestKeepTailRequestAnswersItsCalls: the summarized span can end with a
// call whose result sits in the kept tail; the summarizer must see that
// result, not a call left hanging.
func TestKeepTailRequestAnswersItsCalls(t *testing.T) {
	cases := []struct {
		name string
		h    []schema.Turn
	}{
		{"one call, result kept", []schema.Turn{turnOf(0, 5), turnOf(1, 5), turnOf(2, 5), callTurn(3, 5, "X"), resultTurn(4, "X"), turnOf(5, 5), turnOf(6, 5)}},
		{"parallel calls, separate result turns", []schema.Turn{turnOf(0, 5), turnOf(1, 5), turnOf(2, 5), callTurn(3, 5, "X", "Y"), resultTurn(4, "X"), resultTurn(5, "Y"), turnOf(6, 5), turnOf(7, 5)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := make([]schema.Message, len(tc.h))
			for i, tr := range tc.h {
				h[i] = schema.Message{Turn: tr, Tokens: 5}
			}
			p := schema.Profile{ID: "p", ContextWindow: 1000}
			plan, err := PlanCondense(h, &p, "in")
			mustNoErr(t, err)
			req := plan.Request.Messages
			results := map[string]string{}
			for _, m := range req {
				for _, b := range m.Content.Blocks {
					if b.Type == schema.BlockToolResult {
						results[b.ToolUseID] = b.Content.Text
					}
				}
			}
			for _, m := range req {
				for _, id := range toolUseIDs(m.Content) {
					if results[id] != "output of "+id {
						t.Fatalf("the summarizer sees call %s without its result (got %q)", id, results[id])
					}
				}
			}
			if last := req[len(req)-1]; last.Role != schema.RoleUser || last.Content.HasBlock(schema.BlockToolResult) {
				t.Fatalf("the request must still end with the final instruction: %+v", last)
			}
		})
	}
}

// TestPendingCallKeepsItsResult: a reduction while the agent's last turn
// holds calls without results must leave those calls visible, so the
// results that follow reach the model. Automatic reductions wait for the
// results; manual and forced ones keep the pending calls.
func TestPendingCallKeepsItsResult(t *testing.T) {
	strategies := []string{"keep_tail", "fresh_start", "preserve_fraction", "truncation"}
	triggers := []schema.Trigger{schema.TriggerAuto, schema.TriggerManual, schema.TriggerForced}
	for _, s := range strategies {
		for _, trig := range triggers {
			for _, calls := range [][]string{{"A"}, {"A", "B"}} {
				if s == "truncation" && trig == schema.TriggerManual {
					continue // a manual request only condenses
				}
				name := fmt.Sprintf("%s/%s/%d calls", s, trig, len(calls))
				t.Run(name, func(t *testing.T) {
					p := smallProfile() // allowed 800, threshold 75 %
					if s == "truncation" {
						p.AutoCondense = boolp(false)
					} else {
						p.Strategy = schema.Strategy(s)
					}
					sum := &fixedSummarizer{text: "summary"}
					c := newConv(sum, p)
					ctx := context.Background()
					for i := 0; i < 11; i++ { // 660 tokens, no action
						_, err := c.Append(ctx, turnOf(i, 60))
						mustNoErr(t, err)
					}
					size := 40
					if trig == schema.TriggerAuto {
						size = 200 // 860: over the threshold and the allowed size
					}
					_, err := c.Append(ctx, callTurn(11, size, calls...))
					mustNoErr(t, err)
					switch trig {
					case schema.TriggerManual:
						_, err = c.Apply(ctx, schema.Input{Kind: schema.KindCondense, ID: msgID(900), ConversationID: testConv, TS: 1115, Trigger: trig})
					case schema.TriggerForced:
						_, err = c.Apply(ctx, schema.Input{Kind: schema.KindOverflow, ID: msgID(900), ConversationID: testConv, TS: 1115, Trigger: trig})
					}
					mustNoErr(t, err)
					// One result turn per call (the OpenAI format).
					for j, id := range calls {
						_, err := c.Append(ctx, resultTurn(12+j, id))
						mustNoErr(t, err)
						if lost := lostResults(c.Messages); len(lost) > 0 {
							t.Fatalf("result %v dropped from the effective history: %q", lost, join(c.Effective()))
						}
					}
					if c.State.Condensations+c.State.Truncations == 0 {
						t.Fatalf("nothing was reduced: %v", types(c.Events))
					}
					if local := ContextTokens(c.State.SystemTokens, c.Effective()); trig != schema.TriggerAuto && local != c.State.ContextTokens {
						t.Fatalf("state says %d tokens, effective history has %d", c.State.ContextTokens, local)
					}
				})
			}
		}
	}
}

// TestPreserveFractionSplitsAgentRuns: in a tool-calling run every user turn
// after the first holds only tool results, so a split must also be allowed
// right after a complete call/result exchange.
func TestPreserveFractionSplitsAgentRuns(t *testing.T) {
	for _, name := range []string{"msa_deepseek-chat_django__django-11019", "sweagent_demo_marshmallow-code__marshmallow-1867"} {
		t.Run(name, func(t *testing.T) {
			lines := transcripts.Read(t, filepath.Join(transcriptDir, name+".jsonl"))
			p := schema.Profile{ID: "pf-32k", ContextWindow: 32000, MaxTokens: 4000, Strategy: schema.StrategyPreserveFraction, CondenseThreshold: intp(70)}
			if name[0] == 's' {
				p.ContextWindow = 8000 // the demonstration is short
			}
			c := newConv(&fixedSummarizer{text: "state snapshot"}, p)
			ctx := context.Background()
			for _, l := range lines {
				tr := l.Turn
				tr.ConversationID = testConv
				if _, err := c.Append(ctx, tr); err != nil {
					t.Fatalf("turn %s: %v", l.Turn.ID, err)
				}
				if lost := lostResults(c.Messages); len(lost) > 0 {
					t.Fatalf("after %s: results dropped %v", l.Turn.ID, lost)
				}
				// The summary is a user message: an assistant message
				// follows it, the acknowledgement only where the kept part
				// opens with a user message.
				eff := EffectiveHistory(c.Messages)
				for i, m := range eff {
					switch {
					case m.IsCondenseSummary() && (i+1 == len(eff) || eff[i+1].Role != schema.RoleAssistant):
						t.Fatalf("after %s: the summary is followed by %v", l.Turn.ID, eff[min(i+1, len(eff)-1)].Role)
					case m.IsSummaryAck && (i == 0 || eff[i-1].CondenseID != m.CondenseID || (i+1 < len(eff) && eff[i+1].Role == schema.RoleAssistant)):
						t.Fatalf("after %s: an acknowledgement out of place at %d of %q", l.Turn.ID, i, join(eff))
					}
				}
			}
			condensed, failed := 0, map[schema.Reason]int{}
			for _, e := range c.Events {
				switch e := e.(type) {
				case *schema.CondenseContext:
					condensed++
				case *schema.CondenseFailed:
					failed[e.Error]++
				}
			}
			if condensed == 0 || failed[schema.ReasonNotEnoughMessages] > 0 {
				t.Fatalf("%d condenses, failures %v, %d truncations", condensed, failed, c.State.Truncations)
			}
			t.Logf("%d turns: %d condenses, %d truncations, %d context tokens", len(lines), condensed, c.State.Truncations, c.State.ContextTokens)
		})
	}
}

// TestRewindRebuildsOpenCallsFromStoredHistory: the calls a tool_result may
// answer come from the stored history as it stands after the rewind, even
// when a condense that survives the rewind hides the call.
func TestRewindRebuildsOpenCallsFromStoredHistory(t *testing.T) {
	p := smallProfile()
	p.Strategy = schema.StrategyFreshStart
	c := newConv(&fixedSummarizer{text: "summary"}, p)
	ctx := context.Background()
	for _, tr := range []schema.Turn{turnOf(0, 10), turnOf(1, 10), turnOf(2, 10), callTurn(3, 10, "X")} {
		_, err := c.Append(ctx, tr)
		mustNoErr(t, err)
	}
	// A history a fresh_start condense left hiding the call (as stored by
	// versions that condensed over a pending call), with the result after it.
	const cid = "c-legacy"
	for i := range c.Messages {
		c.Messages[i].CondenseParent = cid
	}
	c.Messages = append(c.Messages, schema.Message{
		Turn:      schema.Turn{ID: "00000000-0000-4000-8000-00000000abcd", ConversationID: testConv, TS: 1031, Role: schema.RoleUser, Content: schema.TextContent("summary")},
		IsSummary: true, CondenseID: cid, Tokens: 2,
	})
	c.Events = append(c.Events, &schema.CondenseContext{EventHeader: schema.EventHeader{Type: schema.EventCondenseContext, TS: 1031}, CondenseID: cid})
	_, err := c.Append(ctx, resultTurn(4, "X"))
	mustNoErr(t, err)
	_, err = c.Append(ctx, turnOf(5, 10))
	mustNoErr(t, err)
	// Rewind to the result, dropping it: the call is open again.
	_, err = c.Apply(ctx, schema.Input{Kind: schema.KindRewind, ID: msgID(901), ConversationID: testConv, TS: turnOf(4, 0).TS})
	mustNoErr(t, err)
	if got := c.State.LastToolUseIDs; !reflect.DeepEqual(got, []string{"X"}) {
		t.Fatalf("open calls after the rewind %v, want [X]", got)
	}
	again := resultTurn(4, "X")
	again.ID = msgID(40)
	if _, err := c.Append(ctx, again); err != nil {
		t.Fatalf("the result accepted before the rewind is rejected after it: %v", err)
	}
}

// TestOpenToolUses pins the helper every planner uses to find calls still
// waiting for their results.
func TestOpenToolUses(t *testing.T) {
	h := []schema.Message{
		{Turn: turnOf(0, 1)},
		{Turn: callTurn(1, 1, "A", "B")},
		{Turn: resultTurn(2, "A")},
	}
	got := openToolUses(h)
	ids := make([]string, 0, len(got))
	for id := range got {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	if !reflect.DeepEqual(ids, []string{"B"}) {
		t.Fatalf("open %v", ids)
	}
	h = append(h, schema.Message{Turn: resultTurn(3, "B")})
	if got := openToolUses(h); len(got) != 0 {
		t.Fatalf("open %v after every result", got)
	}
}

// TestAutoReductionWaitsForResults: an automatic reduction crossed on a turn
// that leaves calls unanswered waits for their results, so it runs once,
// before the agent's next model call, and the summary covers the results.
func TestAutoReductionWaitsForResults(t *testing.T) {
	for _, calls := range [][]string{{"A"}, {"A", "B"}} {
		t.Run(fmt.Sprintf("%d calls", len(calls)), func(t *testing.T) {
			p := smallProfile()
			p.Strategy = schema.StrategyFreshStart
			sum := &fixedSummarizer{text: "summary"}
			c := newConv(sum, p)
			ctx := context.Background()
			for i := 0; i < 11; i++ {
				_, err := c.Append(ctx, turnOf(i, 60))
				mustNoErr(t, err)
			}
			turns := []schema.Turn{callTurn(11, 200, calls...)} // 860 tokens: over threshold and allowed
			for j, id := range calls {
				turns = append(turns, resultTurn(12+j, id))
			}
			for j, tr := range turns {
				evs, err := c.Append(ctx, tr)
				mustNoErr(t, err)
				if last := j == len(turns)-1; last != (len(evs) > 0) {
					t.Fatalf("turn %d of the exchange: events %v", j, types(evs))
				}
			}
			if len(sum.requests) != 1 {
				t.Fatalf("%d summarizer requests", len(sum.requests))
			}
			text := ""
			for _, m := range sum.requests[0].Messages {
				for _, b := range m.Content.Blocks {
					text += b.Text
				}
			}
			for _, id := range calls {
				if !strings.Contains(text, "output of "+id) {
					t.Fatalf("the summary request lacks the result of %s", id)
				}
			}
		})
	}
}
