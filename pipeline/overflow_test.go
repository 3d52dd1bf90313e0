package pipeline_test

import (
	"context"
	"reflect"
	"testing"

	"github.com/google/uuid"

	"github.com/ctxpipe/ctxpipe/schema"
)

// An overflow that can reduce nothing says so: on the demo-16k profile a
// conversation of four short messages has too little to condense and too
// little to truncate, and the overflow's events end in a condense_failed
// with nothing_to_reduce (the refused condense's own reason beside it),
// not in a bare not_enough_messages an agent cannot tell from a condense
// that a truncation follows. Nothing is stored, and an overflow once more
// messages came reduces the context.
func TestOverflowThatReducesNothingSaysSo(t *testing.T) {
	demo := schema.Profile{ID: "demo-16k", ContextWindow: 16000, MaxTokens: 1024, Strategy: schema.StrategyKeepTail}
	threshold := 60
	demo.CondenseThreshold = &threshold
	h := start(t, demo)
	const conv = "overflow-short"
	send := func(role schema.Role, text string) schema.Turn {
		tn := schema.Turn{ID: uuid.NewString(), ConversationID: conv, ProfileID: demo.ID, TS: h.nextTS(), Role: role, Content: schema.TextContent(text)}
		h.publish(schema.InputSubject(conv, schema.KindTurn), tn.ID, tn)
		return tn
	}
	send(schema.RoleUser, "Fix the failing test in pkg/a_test.go.")
	send(schema.RoleAssistant, "Looking at it.")
	send(schema.RoleUser, "It fails on the nil map.")
	last := send(schema.RoleAssistant, "I see the nil map.")
	before := h.history(conv, schema.ViewFull, last.ID)

	of := h.control(conv, schema.KindOverflow, schema.Input{})
	after := h.history(conv, schema.ViewFull, of)
	if !reflect.DeepEqual(after, before) {
		t.Fatalf("an overflow that reduced nothing changed the history: %d messages, %d before", len(after), len(before))
	}
	var got []schema.Event
	for _, e := range h.events(conv) {
		if e.Header().InputID == of {
			got = append(got, e)
		}
	}
	want := []schema.EventType{schema.EventContextManaging, schema.EventCondenseFailed}
	if types := eventTypes(got, of); !reflect.DeepEqual(types, want) {
		t.Fatalf("overflow events %v, want %v", types, want)
	}
	f := got[1].(*schema.CondenseFailed)
	if f.Error != schema.ReasonNothingToReduce || f.CondenseError != schema.ReasonNotEnoughMessages || f.Trigger != schema.TriggerForced || f.Message == "" {
		t.Fatalf("condense_failed %+v, want nothing_to_reduce after not_enough_messages", f)
	}
	if h.ai.Count() != 0 {
		t.Fatalf("the summarizer was asked %d times for a condense refused before any call", h.ai.Count())
	}
	if st, _, err := h.store.State(context.Background(), conv); err != nil || st.CondenseBlocked {
		t.Fatalf("a refusal before any model call blocked condensing (%v)", err)
	}

	// With more to work on, an overflow reduces, and no nothing_to_reduce.
	for i := range 6 {
		role := schema.RoleUser
		if i%2 == 1 {
			role = schema.RoleAssistant
		}
		last = send(role, "More about the nil map and pkg/a.go.")
	}
	h.history(conv, schema.ViewFull, last.ID)
	of = h.control(conv, schema.KindOverflow, schema.Input{})
	h.history(conv, schema.ViewEffective, of)
	var types []schema.EventType
	for _, e := range h.events(conv) {
		if e.Header().InputID != of {
			continue
		}
		types = append(types, e.Header().Type)
		if f, ok := e.(*schema.CondenseFailed); ok && f.Error == schema.ReasonNothingToReduce {
			t.Fatalf("an overflow that reduced said nothing_to_reduce: %+v", f)
		}
	}
	if want := []schema.EventType{schema.EventContextManaging, schema.EventCondenseContext}; !reflect.DeepEqual(types, want) {
		t.Fatalf("second overflow events %v, want %v", types, want)
	}
}
