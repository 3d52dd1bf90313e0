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

// With the character heuristic and fudge 1, a text of 4n ASCII bytes is n tokens.
func turnOf(i int, tokens int) schema.Turn {
	role := schema.RoleUser
	if i%2 == 1 {
		role = schema.RoleAssistant
	}
	return schema.Turn{ID: msgID(i), ConversationID: testConv, TS: int64(1000 + 10*i), Role: role,
		Content: schema.TextContent(strings.Repeat("word", tokens))}
}

func smallProfile() schema.Profile {
	// allowed = 1000 × 0.9 − 100 = 800; the global threshold is 75 %.
	return schema.Profile{ID: "small", ContextWindow: 1000, MaxTokens: 100}
}

func newConv(s Summarizer, p schema.Profile) *Conversation {
	e := charEngine(s)
	e.Globals = schema.Globals{AutoCondense: true, AutoCondensePercent: 75}
	return NewConversation(testConv, p, e)
}

func types(evs []schema.Event) []schema.EventType {
	out := []schema.EventType{}
	for _, e := range evs {
		out = append(out, e.Header().Type)
	}
	return out
}

func TestEngineCondensesAtThreshold(t *testing.T) {
	sum := &fixedSummarizer{text: "short"}
	c := newConv(sum, smallProfile())
	ctx := context.Background()
	for i := 0; i < 7; i++ { // 7 × 100 = 700 tokens: 70 %
		evs, err := c.Append(ctx, turnOf(i, 100))
		mustNoErr(t, err)
		if len(evs) != 0 {
			t.Fatalf("turn %d: unexpected events %v", i, types(evs))
		}
	}
	if c.State.ContextTokens != 700 {
		t.Fatalf("context %d", c.State.ContextTokens)
	}
	evs, err := c.Append(ctx, turnOf(7, 100)) // 800: 80 % ≥ 75 %
	mustNoErr(t, err)
	if got := types(evs); !reflect.DeepEqual(got, []schema.EventType{schema.EventContextManaging, schema.EventCondenseContext}) {
		t.Fatalf("events %v", got)
	}
	cc := evs[1].(*schema.CondenseContext)
	// first + summary + last 3: 100 + 2 ("short" plus the reasoning block is
	// not counted) + 300.
	if cc.PrevContextTokens != 800 || cc.NewContextTokens != 402 || cc.MessagesCondensed != 4 || cc.Trigger != schema.TriggerAuto || cc.Model != "test-model" || cc.Cost != 0.5 {
		t.Fatalf("condense event %+v", cc)
	}
	if c.State.ContextTokens != 402 || c.State.Condensations != 1 {
		t.Fatalf("state %+v", c.State)
	}
	if got := join(c.Effective()); got != "m0 S m5 m6 m7" {
		t.Fatalf("effective %q", got)
	}
	// The summarizer was asked with the detailed prompt about m0..m4.
	req := sum.requests[0]
	if len(req.Messages) != 6 || req.Prompt == "" || req.Strategy != schema.StrategyKeepTail {
		t.Fatalf("request %d messages, strategy %s", len(req.Messages), req.Strategy)
	}
	// Ids are derived from the input: the same input gives the same ids.
	if cc.ID != DeriveID(msgID(7), "event/condense_context") || cc.CondenseID != DeriveID(msgID(7), "condense") {
		t.Fatal("ids not derived from the input id")
	}
}

func TestEngineContextGrewFallsBackToTruncation(t *testing.T) {
	sum := &fixedSummarizer{text: strings.Repeat("long ", 2000)}
	c := newConv(sum, smallProfile())
	ctx := context.Background()
	var evs []schema.Event
	var err error
	for i := 0; i < 9; i++ { // the ninth turn: 900 > 800 allowed
		evs, err = c.Append(ctx, turnOf(i, 100))
		mustNoErr(t, err)
		if i == 7 && !reflect.DeepEqual(types(evs), []schema.EventType{schema.EventContextManaging, schema.EventCondenseFailed}) {
			t.Fatalf("at 80%%: %v", types(evs))
		}
	}
	// The latch: after the failed automatic condense, the next trigger only truncates.
	if got := types(evs); !reflect.DeepEqual(got, []schema.EventType{schema.EventSlidingWindowTruncation}) {
		t.Fatalf("events %v", got)
	}
	tr := evs[0].(*schema.SlidingWindowTruncation)
	// 9 visible → 4 hidden: m0 T m5 m6 m7 m8 = 500 + marker (~13).
	if tr.MessagesRemoved != 4 || tr.PrevContextTokens != 900 || tr.NewContextTokens >= 600 || tr.NewContextTokens <= 500 {
		t.Fatalf("truncation %+v", tr)
	}
	if len(sum.requests) != 1 {
		t.Fatalf("the latch must stop condense loops: %d requests", len(sum.requests))
	}
	// A manual condense is still allowed, and success clears the latch.
	sum.text = "ok"
	evs, err = c.Apply(ctx, schema.Input{Kind: schema.KindCondense, ID: msgID(100), ConversationID: testConv, TS: 5000, Trigger: schema.TriggerManual})
	mustNoErr(t, err)
	if got := types(evs); !reflect.DeepEqual(got, []schema.EventType{schema.EventContextManaging, schema.EventCondenseContext}) {
		t.Fatalf("manual condense %v", got)
	}
	if c.State.CondenseBlocked {
		t.Fatal("a successful condense clears the latch")
	}
}

func TestEngineFirstFailureReason(t *testing.T) {
	cases := []struct {
		name   string
		sum    *fixedSummarizer
		reason schema.Reason
	}{
		{"context grew", &fixedSummarizer{text: strings.Repeat("long ", 2000)}, schema.ReasonContextGrew},
		{"llm error", &fixedSummarizer{err: errors.New("502 bad gateway")}, schema.ReasonLLMError},
		{"empty summary", &fixedSummarizer{text: "  \n"}, schema.ReasonEmptySummary},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newConv(tc.sum, smallProfile())
			ctx := context.Background()
			for i := 0; i < 8; i++ {
				_, err := c.Append(ctx, turnOf(i, 100))
				mustNoErr(t, err)
			}
			// Straight past allowed on one turn: condense fails, truncation follows.
			evs, err := c.Append(ctx, turnOf(8, 20))
			_ = evs
			mustNoErr(t, err)
			var failed *schema.CondenseFailed
			for _, e := range c.Events {
				if f, ok := e.(*schema.CondenseFailed); ok && failed == nil {
					failed = f
				}
			}
			if failed == nil || failed.Error != tc.reason {
				t.Fatalf("first failure %+v", failed)
			}
		})
	}
}

func TestEngineManualAndOverflow(t *testing.T) {
	ctx := context.Background()
	sum := &fixedSummarizer{err: errors.New("down")}
	c := newConv(sum, smallProfile())
	for i := 0; i < 6; i++ {
		_, err := c.Append(ctx, turnOf(i, 10))
		mustNoErr(t, err)
	}
	// Manual condense that fails: no truncation, no latch.
	evs, err := c.Apply(ctx, schema.Input{Kind: schema.KindCondense, ID: msgID(50), ConversationID: testConv, TS: 2000, Trigger: schema.TriggerManual})
	mustNoErr(t, err)
	if got := types(evs); !reflect.DeepEqual(got, []schema.EventType{schema.EventContextManaging, schema.EventCondenseFailed}) || c.State.CondenseBlocked {
		t.Fatalf("manual failure %v blocked=%v", got, c.State.CondenseBlocked)
	}
	// Overflow at a low local count: the provider's word wins, so the
	// engine condenses and, when that fails, truncates.
	evs, err = c.Apply(ctx, schema.Input{Kind: schema.KindOverflow, ID: msgID(51), ConversationID: testConv, TS: 2001, Trigger: schema.TriggerForced})
	mustNoErr(t, err)
	want := []schema.EventType{schema.EventContextManaging, schema.EventCondenseFailed, schema.EventSlidingWindowTruncation}
	if got := types(evs); !reflect.DeepEqual(got, want) {
		t.Fatalf("overflow %v", got)
	}
	if evs[0].(*schema.ContextManaging).Trigger != schema.TriggerForced || evs[2].(*schema.SlidingWindowTruncation).PrevContextTokens != 1000 {
		t.Fatalf("overflow figures %+v %+v", evs[0], evs[2])
	}
	// Same input id again: nothing.
	evs, err = c.Apply(ctx, schema.Input{Kind: schema.KindOverflow, ID: msgID(51), ConversationID: testConv, TS: 2001})
	if err != nil || len(evs) != 0 {
		t.Fatalf("duplicate input: %v %v", evs, err)
	}
	// Condensing is blocked now (the forced condense failed): further
	// overflows truncate until nothing is left, and then say so rather
	// than nothing at all.
	if !c.State.CondenseBlocked {
		t.Fatal("the failed forced condense did not block")
	}
	for i := range 10 {
		evs, err = c.Apply(ctx, schema.Input{Kind: schema.KindOverflow, ID: msgID(52 + i), ConversationID: testConv, TS: 2002 + int64(i), Trigger: schema.TriggerForced})
		mustNoErr(t, err)
		if len(evs) == 0 {
			t.Fatalf("overflow %d: no event", i)
		}
		if f, ok := evs[0].(*schema.CondenseFailed); ok {
			if len(evs) != 1 || f.Error != schema.ReasonNothingToReduce || f.Trigger != schema.TriggerForced || !strings.Contains(f.Message, "blocked") {
				t.Fatalf("overflow %d: %v %+v", i, types(evs), f)
			}
			return
		}
		if _, ok := evs[0].(*schema.SlidingWindowTruncation); !ok || len(evs) != 1 {
			t.Fatalf("overflow %d: %v", i, types(evs))
		}
	}
	t.Fatal("ten overflows truncated every time")
}

func TestEngineUsageIsGroundTruth(t *testing.T) {
	c := newConv(&fixedSummarizer{text: "s"}, smallProfile())
	ctx := context.Background()
	t0 := turnOf(0, 10)
	t0.SystemPrompt = strings.Repeat("sys.", 50) // 50 tokens
	_, err := c.Append(ctx, t0)
	mustNoErr(t, err)
	if c.State.ContextTokens != 60 || c.State.SystemTokens != 50 {
		t.Fatalf("local count %+v", c.State)
	}
	t1 := turnOf(1, 10)
	t1.Usage = &schema.Usage{InputTokens: 300, OutputTokens: 12}
	_, err = c.Append(ctx, t1)
	mustNoErr(t, err)
	if c.State.ContextTokens != 312 {
		t.Fatalf("usage ignored: %d", c.State.ContextTokens)
	}
	_, err = c.Append(ctx, turnOf(2, 10))
	mustNoErr(t, err)
	if c.State.ContextTokens != 322 {
		t.Fatalf("local count after usage: %d", c.State.ContextTokens)
	}
	// Usage alone can trigger a condense (the provider saw a bigger context).
	t3 := turnOf(3, 10)
	t3.Usage = &schema.Usage{InputTokens: 790, OutputTokens: 10}
	evs, err := c.Append(ctx, t3)
	mustNoErr(t, err)
	if len(evs) == 0 || evs[0].Header().Type != schema.EventContextManaging {
		t.Fatalf("usage 800 should trigger: %v", types(evs))
	}
}

func TestEngineRejectsOrphanToolResult(t *testing.T) {
	c := newConv(&fixedSummarizer{text: "s"}, smallProfile())
	ctx := context.Background()
	_, err := c.Append(ctx, turnOf(0, 10))
	mustNoErr(t, err)
	a := turnOf(1, 0)
	a.Content = schema.BlockContent(toolUse("call_1", "bash", `{"cmd":"ls"}`))
	_, err = c.Append(ctx, a)
	mustNoErr(t, err)
	bad := turnOf(2, 0)
	bad.Content = schema.BlockContent(toolResult("call_9", "?"))
	if _, err := c.Append(ctx, bad); schema.ReasonOf(err) != schema.ReasonOrphanToolResult {
		t.Fatalf("orphan: %v", err)
	}
	good := turnOf(2, 0)
	good.Content = schema.BlockContent(toolResult("call_1", "a.go"))
	if _, err := c.Append(ctx, good); err != nil {
		t.Fatalf("answer: %v", err)
	}
	if len(c.Messages) != 3 {
		t.Fatalf("the rejected turn must not be stored: %d messages", len(c.Messages))
	}
}

func TestEngineRewindRestoresExactly(t *testing.T) {
	c := newConv(&fixedSummarizer{text: "s"}, smallProfile())
	ctx := context.Background()
	var before []schema.Message
	for i := 0; i < 12; i++ {
		if i == 7 {
			before = append([]schema.Message(nil), c.Effective()...)
		}
		_, err := c.Append(ctx, turnOf(i, 100))
		mustNoErr(t, err)
	}
	if c.State.Condensations == 0 {
		t.Fatal("expected a condense")
	}
	evs, err := c.Apply(ctx, schema.Input{Kind: schema.KindRewind, ID: msgID(99), ConversationID: testConv, TS: turnOf(7, 0).TS})
	mustNoErr(t, err)
	rw := evs[0].(*schema.Rewind)
	if len(rw.RemovedCondenseIDs) == 0 || rw.MessagesRemoved != 5 {
		t.Fatalf("rewind %+v", rw)
	}
	if !reflect.DeepEqual(c.Effective(), before) || !reflect.DeepEqual(c.Messages, before) {
		t.Fatalf("not restored: %q", join(c.Messages))
	}
	if c.State.ContextTokens != 700 || c.State.Condensations != 0 {
		t.Fatalf("state after rewind %+v", c.State)
	}
	// Nothing after the cutoff: rejected with a reason.
	_, err = c.Apply(ctx, schema.Input{Kind: schema.KindRewind, ID: msgID(98), ConversationID: testConv, TS: 99999})
	if schema.ReasonOf(err) != schema.ReasonUnknownTarget {
		t.Fatalf("rewind past the end: %v", err)
	}
}

func TestEngineStrategies(t *testing.T) {
	for _, s := range []schema.Strategy{schema.StrategyKeepTail, schema.StrategyFreshStart, schema.StrategyPreserveFraction} {
		t.Run(string(s), func(t *testing.T) {
			p := smallProfile()
			p.Strategy = s
			c := newConv(&fixedSummarizer{text: "summary"}, p)
			ctx := context.Background()
			for i := 0; i < 40; i++ {
				_, err := c.Append(ctx, turnOf(i, 60))
				mustNoErr(t, err)
			}
			if c.State.Condensations < 2 {
				t.Fatalf("%s: %d condensations", s, c.State.Condensations)
			}
			if c.State.ContextTokens > 800 {
				t.Fatalf("%s: context %d still over allowed", s, c.State.ContextTokens)
			}
			local := ContextTokens(c.State.SystemTokens, c.Effective())
			if local != c.State.ContextTokens {
				t.Fatalf("%s: state says %d tokens, effective history has %d", s, c.State.ContextTokens, local)
			}
			for _, e := range c.Events {
				if cc, ok := e.(*schema.CondenseContext); ok && cc.Strategy != string(s) {
					t.Fatalf("event strategy %q", cc.Strategy)
				}
			}
		})
	}
}

func ExampleConversation() {
	// Manage a conversation in process: no NATS, no SQLite. The summarizer
	// here is a function; in practice it is condense.NewRouter's.
	summarize := SummarizerFunc(func(_ context.Context, req schema.SummaryRequest) (schema.Summary, error) {
		return schema.Summary{Text: fmt.Sprintf("(summary of %d messages)", len(req.Messages)-1), Model: "example"}, nil
	})
	profile := schema.Profile{ID: "tiny", ContextWindow: 2000, MaxTokens: 200}
	conv := NewConversation("demo", profile, NewEngine(summarize))
	ctx := context.Background()
	for i := 0; i < 12; i++ {
		role := schema.RoleUser
		if i%2 == 1 {
			role = schema.RoleAssistant
		}
		evs, err := conv.Append(ctx, schema.Turn{
			ID: fmt.Sprintf("00000000-0000-4000-8000-%012d", i), TS: int64(1 + i),
			Role: role, Content: schema.TextContent(strings.Repeat("context management ", 60)),
		})
		if err != nil {
			fmt.Println("error:", err)
			return
		}
		for _, e := range evs {
			if cc, ok := e.(*schema.CondenseContext); ok {
				fmt.Printf("turn %d: condensed %d messages, %d → %d tokens\n", i, cc.MessagesCondensed, cc.PrevContextTokens, cc.NewContextTokens)
			}
		}
	}
	fmt.Println(len(conv.Messages), "stored,", len(conv.Effective()), "sent to the model")
	// Output:
	// turn 8: condensed 5 messages, 1638 → 737 tokens
	// 13 stored, 8 sent to the model
}

func TestEngineControlOnUnknownConversation(t *testing.T) {
	for _, k := range []schema.InputKind{schema.KindCondense, schema.KindOverflow, schema.KindRewind} {
		t.Run(string(k), func(t *testing.T) {
			sum := &fixedSummarizer{text: "s"}
			c := newConv(sum, smallProfile())
			before := c.State
			in := schema.Input{Kind: k, ID: msgID(1), ConversationID: testConv, TS: 1000}
			if k == schema.KindCondense {
				in.Trigger = schema.TriggerManual
			}
			evs, err := c.Apply(context.Background(), in)
			var se *schema.Error
			if !errors.As(err, &se) || se.Reason != schema.ReasonUnknownConversation {
				t.Fatalf("%s on a conversation with no turn: %v", k, err)
			}
			if len(evs) != 0 || len(c.Events) != 0 || len(c.Messages) != 0 || !reflect.DeepEqual(c.State, before) || len(sum.requests) != 0 {
				t.Fatalf("something changed: events %v, %d messages, state %+v", types(evs), len(c.Messages), c.State)
			}
			// Engine.Apply itself answers with the error and no changes.
			ch, err := c.Engine.Apply(context.Background(), schema.ConversationState{}, memHistory{c}, &c.Profile, in)
			if ch != nil || schema.ReasonOf(err) != schema.ReasonUnknownConversation {
				t.Fatalf("Engine.Apply: %v %v", ch, err)
			}
		})
	}
}

func TestEngineOverflowVerifiesRealShrink(t *testing.T) {
	// 300 real tokens; the overflow raises the decision's count to the
	// window (1000), but a summary that leaves 600 tokens grew the context.
	sum := &fixedSummarizer{text: strings.Repeat("grow", 400)}
	c := newConv(sum, smallProfile())
	ctx := context.Background()
	for i := 0; i < 6; i++ {
		_, err := c.Append(ctx, turnOf(i, 50))
		mustNoErr(t, err)
	}
	evs, err := c.Apply(ctx, schema.Input{Kind: schema.KindOverflow, ID: msgID(60), ConversationID: testConv, TS: 2000})
	mustNoErr(t, err)
	if len(evs) < 2 {
		t.Fatalf("events %v", types(evs))
	}
	f, ok := evs[1].(*schema.CondenseFailed)
	if !ok || f.Error != schema.ReasonContextGrew {
		t.Fatalf("a summary that grows the real context was accepted: %v", types(evs))
	}
	if c.State.Condensations != 0 || c.State.ContextTokens > 300 {
		t.Fatalf("state %+v", c.State)
	}
}

// A condense refused before any model call (too few messages yet) does not
// block the next ones: each later turn over the threshold tries again, as
// Roo decides again on every turn, and one succeeds once there is enough
// to summarize. Only a summarizer's failure latches (see
// TestEngineContextGrewFallsBackToTruncation).
func TestRefusalBeforeTheModelDoesNotLatch(t *testing.T) {
	sum := &fixedSummarizer{text: "summary"}
	c := newConv(sum, smallProfile()) // allowed 800, threshold 75 % = 750
	ctx := context.Background()
	var evs []schema.Event
	for i := range 3 { // 780 tokens in three messages: over 75 %, too few to condense
		var err error
		evs, err = c.Append(ctx, turnOf(i, 260))
		mustNoErr(t, err)
	}
	var failed *schema.CondenseFailed
	for _, e := range evs {
		if f, ok := e.(*schema.CondenseFailed); ok {
			failed = f
		}
	}
	if failed == nil || failed.Error != schema.ReasonNotEnoughMessages {
		t.Fatalf("third turn at 78 %%: %v", types(evs))
	}
	if c.State.CondenseBlocked {
		t.Fatal("a refusal before any model call blocked later condenses")
	}
	condensed := false
	for i := 3; i < 9 && !condensed; i++ {
		evs, err := c.Append(ctx, turnOf(i, 5))
		mustNoErr(t, err)
		for _, e := range evs {
			_, ok := e.(*schema.CondenseContext)
			condensed = condensed || ok
		}
	}
	if !condensed || len(sum.requests) == 0 {
		t.Fatalf("no later turn condensed (%d summarizer calls)", len(sum.requests))
	}
}
