package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/ctxpipe/ctxpipe/engine"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/store"
	"github.com/ctxpipe/ctxpipe/tokens"
)

// Maskings, pins and the condenses that follow them commit through
// store.Commit as generic inserts and tag changes: the stored history, the
// store's visible-messages query and a rewind agree with the in-memory
// Conversation at every step.
func TestMaskingCommitsThroughTheStore(t *testing.T) {
	ctx := context.Background()
	s, err := store.Open(ctx, filepath.Join(t.TempDir(), "ctx.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const conv = "mask-store"
	p := schema.Profile{ID: "m", ContextWindow: 10000, MaxTokens: 100, Strategy: schema.StrategyKeepTail,
		MinGainTokens: new(int), Mask: schema.MaskSettings{Enabled: true, KeepLast: new(int)}}
	eng := charCountEngine("summary")
	mem := engine.NewConversation(conv, p, eng)

	id := func(i int) string { return fmt.Sprintf("00000000-0000-4000-8000-%012d", i) }
	var inputs []schema.Input
	add := func(in schema.Input) { inputs = append(inputs, in) }
	turn := func(i int, role schema.Role, c schema.Content) {
		t := schema.Turn{ID: id(i), ConversationID: conv, TS: int64(1000 + 10*i), Role: role, Content: c}
		add(schema.Input{Kind: schema.KindTurn, ID: t.ID, ConversationID: conv, TS: t.TS, Turn: &t})
	}
	turn(0, schema.RoleUser, schema.TextContent("Fix the parser"))
	for k := 0; k < 12; k++ {
		call := fmt.Sprintf("c%d", k)
		turn(1+2*k, schema.RoleAssistant, schema.BlockContent(schema.Block{Type: schema.BlockToolUse, ID: call, Name: "bash",
			Input: json.RawMessage(fmt.Sprintf(`{"command":"cat src/f%d.go"}`, k))}))
		out := schema.TextContent(strings.Repeat("outputs\n", 500+100*k))
		turn(2+2*k, schema.RoleUser, schema.BlockContent(schema.Block{Type: schema.BlockToolResult, ToolUseID: call, Content: &out}))
		if k == 8 { // a condense that hides stand-ins: the originals must stay hidden
			add(schema.Input{Kind: schema.KindCondense, ID: id(550), ConversationID: conv, TS: int64(1000 + 10*(2+2*k)), Trigger: schema.TriggerManual})
		}
		if k == 3 {
			add(schema.Input{Kind: schema.KindPin, ID: id(500), ConversationID: conv, TS: 1075, MessageID: id(2), Pinned: true})
		}
	}
	add(schema.Input{Kind: schema.KindRewind, ID: id(600), ConversationID: conv, TS: 1000 + 10*20, IncludeTarget: true})
	add(schema.Input{Kind: schema.KindRewind, ID: id(601), ConversationID: conv, TS: 1000 + 10*9})

	seen, hiddenStandIn := map[schema.EventType]bool{}, false
	for n, in := range inputs {
		ch, stored := applyBoth(ctx, t, s, eng, mem, &p, n, in)
		for _, e := range ch.Events {
			seen[e.Header().Type] = true
		}
		for _, m := range stored {
			if m.IsMask() && m.CondenseParent != "" {
				hiddenStandIn = true
			}
		}
		state, _, _ := s.State(ctx, conv)
		if !reflect.DeepEqual(state.Pins, mem.State.Pins) {
			t.Fatalf("input %d: pins %v in the store, %v in memory", n, state.Pins, mem.State.Pins)
		}
	}
	if !hiddenStandIn {
		t.Error("no condense hid a stand-in: the store's visible query is not put to the test")
	}
	for _, want := range []schema.EventType{schema.EventToolResultsMasked, schema.EventCondenseContext, schema.EventRewind} {
		if !seen[want] {
			t.Errorf("no %s in the run: the test does not cover it", want)
		}
	}
}

// preserve_fraction's acknowledgement commits and reads back as the engine
// made it: the stored history and the store's visible messages agree with
// the in-memory Conversation through condenses and a rewind, and a store
// opened again (nothing cached) still knows the acknowledgement for one.
func TestSummaryAckCommitsThroughTheStore(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ctx.db")
	s, err := store.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	const conv = "ack-store"
	p := schema.Profile{ID: "pf", ContextWindow: 100000, MaxTokens: 100, Strategy: schema.StrategyPreserveFraction, MinGainTokens: new(int)}
	eng := charCountEngine("snapshot")
	mem := engine.NewConversation(conv, p, eng)
	id := func(i int) string { return fmt.Sprintf("00000000-0000-4000-8000-%012d", i) }
	var inputs []schema.Input
	for i := range 30 {
		role := schema.RoleUser
		if i%2 == 1 {
			role = schema.RoleAssistant
		}
		t := schema.Turn{ID: id(i), ConversationID: conv, TS: int64(1000 + 10*i), Role: role, Content: schema.TextContent(strings.Repeat(fmt.Sprintf("turn %d ", i), 40))}
		inputs = append(inputs, schema.Input{Kind: schema.KindTurn, ID: t.ID, ConversationID: conv, TS: t.TS, Turn: &t})
		if i == 13 || i == 27 {
			inputs = append(inputs, schema.Input{Kind: schema.KindCondense, ID: id(500 + i), ConversationID: conv, TS: t.TS, Trigger: schema.TriggerManual})
		}
	}
	inputs = append(inputs, schema.Input{Kind: schema.KindRewind, ID: id(600), ConversationID: conv, TS: 1000 + 10*20})
	acks := 0
	for n, in := range inputs {
		_, stored := applyBoth(ctx, t, s, eng, mem, &p, n, in)
		for _, m := range stored {
			if m.IsSummaryAck {
				acks++
			}
		}
	}
	if acks == 0 {
		t.Fatal("no acknowledgement was stored: the test does not cover it")
	}
	want := mem.Messages
	s.Close()
	if s, err = store.Open(ctx, path); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.Messages(ctx, conv)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatal("read back from SQLite alone, the history differs")
	}
	n := 0
	for _, m := range got {
		if m.IsSummaryAck {
			n++
		}
	}
	if n == 0 {
		t.Fatalf("the rewind left no condense, or the acknowledgement was lost: %d acks", n)
	}
}

// charCountEngine is an engine counting characters, whose summarizer says
// "<what> of N messages".
func charCountEngine(what string) *engine.Engine {
	eng := engine.NewEngine(engine.SummarizerFunc(func(_ context.Context, req schema.SummaryRequest) (schema.Summary, error) {
		return schema.Summary{Text: fmt.Sprintf("%s of %d messages", what, len(req.Messages)), Model: "t"}, nil
	}))
	eng.Log = slog.New(slog.DiscardHandler)
	eng.Globals = schema.Globals{AutoCondense: true, AutoCondensePercent: 75}
	eng.Counter = func(*schema.Profile) (tokens.Counter, error) {
		return tokens.Counter{Text: tokens.Chars{}, Fudge: 1}, nil
	}
	return eng
}

// applyBoth applies input n through the store (Apply over the stored
// conversation, then Commit) and to mem, and fails unless the stored
// history is mem's and the effective history over the store's visible
// messages is mem's effective history. It returns the changes and the
// stored history.
func applyBoth(ctx context.Context, t *testing.T, s *store.Store, eng *engine.Engine, mem *engine.Conversation, p *schema.Profile, n int, in schema.Input) (*schema.Changes, []schema.Message) {
	t.Helper()
	conv := in.ConversationID
	st, _, err := s.State(ctx, conv)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := eng.Apply(ctx, st, s.Conversation(conv), p, in)
	if err != nil {
		t.Fatalf("input %d: %v", n, err)
	}
	payload, _ := json.Marshal(map[string]any{"id": in.ID, "n": n})
	rec := store.InputRecord{ID: in.ID, ConversationID: conv, Kind: string(in.Kind), Subject: schema.InputSubject(conv, in.Kind),
		TS: in.TS, Payload: payload, Status: store.StatusApplied}
	if _, err := s.Commit(ctx, []store.Entry{{Input: rec, Changes: ch}}); err != nil {
		t.Fatalf("input %d (%s): commit: %v", n, in.Kind, err)
	}
	if _, err := mem.Apply(ctx, in); err != nil {
		t.Fatalf("input %d in memory: %v", n, err)
	}
	stored, err := s.Messages(ctx, conv)
	if err != nil {
		t.Fatal(err)
	}
	if len(stored)+len(mem.Messages) > 0 && !reflect.DeepEqual(stored, mem.Messages) {
		t.Fatalf("input %d (%s): the store holds another history than Apply makes", n, in.Kind)
	}
	visible, _, err := s.Visible(ctx, conv)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := engine.EffectiveHistory(visible), mem.Effective(); len(got)+len(want) > 0 && !reflect.DeepEqual(got, want) {
		t.Fatalf("input %d (%s): effective history over the store's visible messages differs", n, in.Kind)
	}
	return ch, stored
}
