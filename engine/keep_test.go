package engine

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/ctxpipe/ctxpipe/schema"
)

// instructedRun is an agent run with a second user instruction in the
// middle (m9) and a pinned note (m4, the result of call1): the task m0, then
// call/result exchanges. Results are large so that any reduction hides them.
func instructedRun(pinNote bool) []schema.Turn {
	turns := agentTurns(8, 300)
	turns[9] = turnOf(9, 30) // replaces call4; its result m10 is turned into text below
	turns[9].Role = schema.RoleUser
	turns[9].Content = schema.TextContent("Now also keep the failing test names")
	turns[8].Role = schema.RoleUser // m8 answers call3; m9 is a follow-up with no result
	turns[10].Role = schema.RoleAssistant
	turns[10].Content = schema.TextContent("ok")
	if pinNote {
		turns[4].Pinned = true
	}
	return turns
}

func visibleByID(msgs []schema.Message) map[string]schema.Message {
	out := map[string]schema.Message{}
	for _, m := range EffectiveHistory(msgs) {
		out[m.ID] = m
	}
	return out
}

// The task, the latest instruction and pinned messages stay verbatim through
// every strategy and a truncation; keep_task off brings back the old
// behaviour for the first two.
func TestWhatMustSurvive(t *testing.T) {
	strategies := []schema.Strategy{schema.StrategyKeepTail, schema.StrategyFreshStart, schema.StrategyPreserveFraction}
	for _, s := range strategies {
		for _, keepTask := range []bool{true, false} {
			for _, reduce := range []string{"condense", "truncate"} {
				name := string(s) + "/" + reduce
				if !keepTask {
					name += "/keep_task off"
				}
				t.Run(name, func(t *testing.T) {
					p := schema.Profile{ID: "p", ContextWindow: 1 << 20, Strategy: s, KeepTask: boolp(keepTask)}
					c := newConv(&fixedSummarizer{text: "summary"}, p)
					turns := instructedRun(true)
					appendAll(t, c, turns)
					stored := visibleByID(c.Messages)
					var evs []schema.Event
					var err error
					if reduce == "condense" {
						evs, err = c.Apply(context.Background(), schema.Input{Kind: schema.KindCondense, ID: msgID(900), ConversationID: testConv, TS: 9000, Trigger: schema.TriggerManual})
					} else {
						tr, ok := PlanTruncationKeeping(c.Messages, 1, "t1", MustKeep(c.Messages, c.State.Pins, &p), charCount)
						if !ok {
							t.Fatal("nothing truncated")
						}
						c.Messages = Apply(c.Messages, &tr.Changes)
					}
					mustNoErr(t, err)
					if reduce == "condense" && types(evs)[len(evs)-1] != schema.EventCondenseContext {
						t.Fatalf("events %v", types(evs))
					}
					eff := visibleByID(c.Messages)
					for _, tc := range []struct {
						what string
						id   string
						kept bool
					}{
						{"the task", msgID(0), keepTask || s == schema.StrategyKeepTail || reduce == "truncate"},
						{"the latest instruction", msgID(9), keepTask},
						{"the pinned message", msgID(4), true},
					} {
						got, ok := eff[tc.id]
						if ok && !reflect.DeepEqual(got, stored[tc.id]) {
							t.Errorf("%s changed: %+v", tc.what, got.Content)
						}
						if ok != tc.kept && (tc.kept || reduce == "condense") {
							t.Errorf("%s visible = %v, want %v (effective %q)", tc.what, ok, tc.kept, join(EffectiveHistory(c.Messages)))
						}
					}
					// A pinned result keeps its call visible, and no result is dropped.
					if _, ok := eff[msgID(3)]; !ok {
						t.Errorf("the pinned result's call is hidden: %q", join(EffectiveHistory(c.Messages)))
					}
					if lost := lostResults(c.Messages); len(lost) > 0 {
						t.Errorf("results dropped: %v", lost)
					}
				})
			}
		}
	}
}

func TestPinInput(t *testing.T) {
	ctx := context.Background()
	p := schema.Profile{ID: "p", ContextWindow: 1 << 20, Strategy: schema.StrategyFreshStart, KeepTask: boolp(false)}
	pin := func(c *Conversation, n int, id string, pinned bool) error {
		_, err := c.Apply(ctx, schema.Input{Kind: schema.KindPin, ID: msgID(800 + n), ConversationID: testConv, TS: 8000 + int64(n), MessageID: id, Pinned: pinned})
		return err
	}
	condense := func(c *Conversation, n int) {
		_, err := c.Apply(ctx, schema.Input{Kind: schema.KindCondense, ID: msgID(900 + n), ConversationID: testConv, TS: 9000 + int64(n), Trigger: schema.TriggerManual})
		mustNoErr(t, err)
	}
	tests := []struct {
		name    string
		pins    func(c *Conversation) error
		visible []string // of m0, m2, m4
	}{
		{"nothing pinned", func(*Conversation) error { return nil }, nil},
		{"pinned by input", func(c *Conversation) error { return pin(c, 1, msgID(2), true) }, []string{msgID(2)}},
		{"pinned then unpinned", func(c *Conversation) error {
			mustNoErr(t, pin(c, 1, msgID(2), true))
			return pin(c, 2, msgID(2), false)
		}, nil},
		{"stored flag unpinned by input", func(c *Conversation) error {
			c.Messages[4].Pinned = true // as if the turn carried pinned: true
			return pin(c, 1, msgID(4), false)
		}, nil},
		{"stored flag", func(c *Conversation) error { c.Messages[0].Pinned = true; return nil }, []string{msgID(0)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newConv(&fixedSummarizer{text: "summary"}, p)
			appendAll(t, c, agentTurns(4, 40))
			mustNoErr(t, tt.pins(c))
			condense(c, 1)
			eff := visibleByID(c.Messages)
			var got []string
			for _, id := range []string{msgID(0), msgID(2), msgID(4)} {
				if _, ok := eff[id]; ok {
					got = append(got, id)
				}
			}
			if !reflect.DeepEqual(got, tt.visible) {
				t.Fatalf("visible %v, want %v (effective %q)", got, tt.visible, join(EffectiveHistory(c.Messages)))
			}
			if len(c.State.Pins) > 1 {
				t.Fatalf("pins %v: a verdict that matches the stored flag is not kept", c.State.Pins)
			}
		})
	}
	c := newConv(&fixedSummarizer{text: "summary"}, p)
	appendAll(t, c, agentTurns(2, 40))
	if err := pin(c, 1, msgID(77), true); schema.ReasonOf(err) != schema.ReasonUnknownTarget {
		t.Fatalf("pin of an unknown message: %v", err)
	}
	// A rewind that deletes a pinned message drops its pin.
	mustNoErr(t, pin(c, 2, msgID(4), true))
	_, err := c.Apply(ctx, schema.Input{Kind: schema.KindRewind, ID: msgID(700), ConversationID: testConv, TS: 1040})
	mustNoErr(t, err)
	if c.State.Pins != nil {
		t.Fatalf("pins after rewind %v", c.State.Pins)
	}
}

// When what must stay verbatim is over the allowed context, the condense
// fails with pinned_over_window and the truncation keeps it.
func TestPinnedOverWindow(t *testing.T) {
	p := smallProfile() // 800 tokens allowed
	c := newConv(&fixedSummarizer{text: "s"}, p)
	big := turnOf(6, 850)
	big.Pinned = true
	evs := appendAll(t, c, []schema.Turn{turnOf(0, 10), turnOf(1, 10), turnOf(2, 10), turnOf(3, 10), turnOf(4, 10), turnOf(5, 10), big})
	var failed *schema.CondenseFailed
	for _, e := range evs {
		if f, ok := e.(*schema.CondenseFailed); ok && failed == nil {
			failed = f
		}
	}
	if failed == nil || failed.Error != schema.ReasonPinnedOverWindow {
		t.Fatalf("events %v", types(evs))
	}
	if _, ok := visibleByID(c.Messages)[msgID(6)]; !ok {
		t.Fatalf("the pinned message was hidden: %q", join(c.Effective()))
	}
}

// An automatic reduction that frees less than min_gain_tokens is not made;
// a manual condense is.
func TestMinimumGain(t *testing.T) {
	tests := []struct {
		name    string
		gain    *int
		trigger schema.Trigger
		want    []schema.EventType
	}{
		{"default gain (50 tokens of a 1,000 window): condensed", nil, schema.TriggerAuto, []schema.EventType{schema.EventContextManaging, schema.EventCondenseContext}},
		{"gain above what a condense frees: nothing", intp(500), schema.TriggerAuto, []schema.EventType{}},
		{"manual ignores the gain", intp(500), schema.TriggerManual, []schema.EventType{schema.EventContextManaging, schema.EventCondenseContext}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := smallProfile()
			p.MinGainTokens = tt.gain
			sum := &fixedSummarizer{text: "short"}
			c := newConv(sum, p)
			// m0 400 tokens (kept: the task), four of 40, two of 60, then
			// 100: 780 ≥ 75 % of 1,000 but under the 800 allowed; a
			// keep_tail condense would hide m1..m4, 160 tokens.
			turns := []schema.Turn{turnOf(0, 400), turnOf(1, 40), turnOf(2, 40), turnOf(3, 40), turnOf(4, 40), turnOf(5, 60), turnOf(6, 60)}
			last := turnOf(7, 100)
			appendAll(t, c, turns)
			var evs []schema.Event
			var err error
			if tt.trigger == schema.TriggerAuto {
				evs, err = c.Append(context.Background(), last)
			} else {
				appendAll(t, c, []schema.Turn{last})
				evs, err = c.Apply(context.Background(), schema.Input{Kind: schema.KindCondense, ID: msgID(900), ConversationID: testConv, TS: 5000, Trigger: schema.TriggerManual})
			}
			mustNoErr(t, err)
			if got := types(evs); !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("events %v, want %v", got, tt.want)
			}
			if tt.trigger == schema.TriggerAuto && len(tt.want) == 0 && len(sum.requests) != 0 {
				t.Fatal("the summarizer was called for a gain below the minimum")
			}
		})
	}
}

// A turn that names a profile with a smaller window is checked against that
// window in the same Apply, so the reduction is in the Changes committed
// before the turn is acked.
func TestModelSwitchChecksTheNewWindow(t *testing.T) {
	big := schema.Profile{ID: "big", ContextWindow: 200000}
	small := schema.Profile{ID: "small", ContextWindow: 16000}
	for _, s := range []schema.Strategy{schema.StrategyKeepTail, schema.StrategyFreshStart, schema.StrategyPreserveFraction} {
		t.Run(string(s), func(t *testing.T) {
			big.Strategy, small.Strategy = s, s
			c := newConv(&fixedSummarizer{text: "summary"}, big)
			evs := appendAll(t, c, agentTurns(10, 2000)) // ~21k tokens: 10 % of 200k
			if len(evs) != 0 || c.State.ContextTokens < 20000 {
				t.Fatalf("events %v at %d tokens", types(evs), c.State.ContextTokens)
			}
			c.Profile = small // the next turn names profile "small"
			next := turnOf(21, 10)
			next.Role = schema.RoleAssistant
			next.ProfileID = "small"
			evs, err := c.Append(context.Background(), next)
			mustNoErr(t, err)
			if len(evs) == 0 {
				t.Fatal("no reduction for the smaller window")
			}
			if c.State.ProfileID != "small" || float64(c.State.ContextTokens) > AllowedTokens(&small) {
				t.Fatalf("after the switch: %d tokens of %v allowed (events %v)", c.State.ContextTokens, AllowedTokens(&small), types(evs))
			}
		})
	}
}

// A manual condense's instructions go to the summarizer and into the event.
func TestCondenseInstructions(t *testing.T) {
	sum := &fixedSummarizer{text: "summary"}
	c := newConv(sum, schema.Profile{ID: "p", ContextWindow: 1 << 20})
	appendAll(t, c, agentTurns(4, 40))
	evs, err := c.Apply(context.Background(), schema.Input{Kind: schema.KindCondense, ID: msgID(900), ConversationID: testConv, TS: 9000,
		Trigger: schema.TriggerManual, Instructions: "keep the failing test names"})
	mustNoErr(t, err)
	cc, ok := evs[len(evs)-1].(*schema.CondenseContext)
	if !ok || cc.Instructions != "keep the failing test names" || sum.requests[0].Instructions != cc.Instructions {
		t.Fatalf("events %v, request instructions %q", types(evs), sum.requests[0].Instructions)
	}
	if !strings.Contains(sum.requests[0].Prompt, "summary") {
		t.Fatalf("prompt %q", sum.requests[0].Prompt)
	}
}

// keep_tail with nothing it may hide (the task and a pinned turn are all
// that lie before the kept tail) refuses before the model is asked, as the
// other strategies do: no paid summary thrown away as context_grew, and an
// overflow does not latch automatic condensing (conformance run, D2).
func TestKeepTailWithNothingToHideAsksNoModel(t *testing.T) {
	sum := &fixedSummarizer{text: "s"}
	c := newConv(sum, smallProfile())
	ctx := context.Background()
	for i := range 5 {
		tr := turnOf(i, 20)
		tr.Pinned = i == 1
		_, err := c.Append(ctx, tr)
		mustNoErr(t, err)
	}
	evs, err := c.Apply(ctx, schema.Input{Kind: schema.KindOverflow, ID: msgID(50), ConversationID: testConv, TS: 2000})
	mustNoErr(t, err)
	if len(sum.requests) != 0 {
		t.Fatalf("the summarizer was asked %d times; events %v", len(sum.requests), types(evs))
	}
	if c.State.CondenseBlocked {
		t.Fatal("automatic condensing latched although no summary could have shrunk the context")
	}
	var reasons []schema.Reason
	for _, e := range evs {
		if f, ok := e.(*schema.CondenseFailed); ok {
			reasons = append(reasons, f.Error)
		}
	}
	if len(reasons) != 0 && reasons[0] != schema.ReasonNotEnoughMessages && reasons[0] != schema.ReasonNothingToReduce {
		t.Fatalf("reasons %v, events %v", reasons, types(evs))
	}
}
