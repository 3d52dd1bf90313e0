package engine

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/ctxpipe/ctxpipe/schema"
)

// EndUnreduced leaves the events of a forced reduction that reduced
// something as they are, and makes one that reduced nothing end in
// nothing_to_reduce: the tried condense's failure becomes it, or it is
// appended when no condense was tried.
func TestEndUnreduced(t *testing.T) {
	ev := func(typ schema.EventType) schema.EventHeader {
		return schema.EventHeader{ID: "id-" + string(typ), Type: typ}
	}
	managing := &schema.ContextManaging{EventHeader: ev(schema.EventContextManaging), Trigger: schema.TriggerForced}
	failed := func(r schema.Reason) *schema.CondenseFailed {
		return &schema.CondenseFailed{EventHeader: ev(schema.EventCondenseFailed), Error: r, Message: "why " + string(r), Cost: 0.25, Trigger: schema.TriggerForced}
	}
	condensed := &schema.CondenseContext{EventHeader: ev(schema.EventCondenseContext)}
	truncated := &schema.SlidingWindowTruncation{EventHeader: ev(schema.EventSlidingWindowTruncation)}
	masked := &schema.ToolResultsMasked{EventHeader: ev(schema.EventToolResultsMasked)}
	nothing := &schema.CondenseFailed{EventHeader: ev(schema.EventCondenseFailed), Error: schema.ReasonNothingToReduce,
		Message: "nothing is left to truncate: …", Trigger: schema.TriggerForced}
	ended := func(r schema.Reason) *schema.CondenseFailed {
		return &schema.CondenseFailed{EventHeader: ev(schema.EventCondenseFailed), Error: schema.ReasonNothingToReduce, CondenseError: r,
			Message: "the condense failed (" + string(r) + ": why " + string(r) + "), and nothing is left to truncate: …", Cost: 0.25, Trigger: schema.TriggerForced}
	}
	cases := []struct {
		name     string
		evs, out []schema.Event
	}{
		{"condensed", []schema.Event{managing, condensed}, []schema.Event{managing, condensed}},
		{"condense failed, truncated", []schema.Event{managing, failed(schema.ReasonLLMError), truncated}, []schema.Event{managing, failed(schema.ReasonLLMError), truncated}},
		{"blocked, truncated", []schema.Event{truncated}, []schema.Event{truncated}},
		{"masked, then the condense failed", []schema.Event{masked, managing, failed(schema.ReasonContextGrew)}, []schema.Event{masked, managing, failed(schema.ReasonContextGrew)}},
		{"refused before any call, nothing to truncate", []schema.Event{managing, failed(schema.ReasonNotEnoughMessages)}, []schema.Event{managing, ended(schema.ReasonNotEnoughMessages)}},
		{"the summary failed, nothing to truncate", []schema.Event{managing, failed(schema.ReasonLLMError)}, []schema.Event{managing, ended(schema.ReasonLLMError)}},
		{"pinned over the window, nothing to truncate", []schema.Event{managing, failed(schema.ReasonPinnedOverWindow)}, []schema.Event{managing, ended(schema.ReasonPinnedOverWindow)}},
		{"blocked, nothing to truncate", nil, []schema.Event{nothing}},
		{"said already", []schema.Event{nothing}, []schema.Event{nothing}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := append([]schema.Event(nil), c.evs...)
			got := EndUnreduced(in, nothing)
			if !reflect.DeepEqual(got, c.out) {
				t.Fatalf("EndUnreduced =\n %v\nwant\n %v", describe(got), describe(c.out))
			}
			if !reflect.DeepEqual(in, c.evs) {
				t.Fatal("EndUnreduced changed its argument's elements")
			}
		})
	}
}

func describe(evs []schema.Event) []string {
	var out []string
	for _, e := range evs {
		s := string(e.Header().Type)
		if f, ok := e.(*schema.CondenseFailed); ok {
			s += "{" + string(f.Error) + "/" + string(f.CondenseError) + " " + f.Message + "}"
		}
		out = append(out, s)
	}
	return out
}

// Through the engine: every overflow ends in a reduction or in
// nothing_to_reduce, whatever stopped the condense.
func TestOverflowEndsInAReductionOrNothingToReduce(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name      string
		sum       Summarizer
		messages  int
		want      []schema.EventType
		condenseE schema.Reason // on the nothing_to_reduce, or "" when it reduced
	}{
		{"four messages: too few to condense or to truncate", &fixedSummarizer{text: "s"}, 4,
			[]schema.EventType{schema.EventContextManaging, schema.EventCondenseFailed}, schema.ReasonNotEnoughMessages},
		{"two messages", &fixedSummarizer{text: "s"}, 2,
			[]schema.EventType{schema.EventContextManaging, schema.EventCondenseFailed}, schema.ReasonNotEnoughMessages},
		{"enough to condense", &fixedSummarizer{text: "s"}, 8,
			[]schema.EventType{schema.EventContextManaging, schema.EventCondenseContext}, ""},
		{"the summarizer fails: a truncation follows", &fixedSummarizer{err: errors.New("down")}, 8,
			[]schema.EventType{schema.EventContextManaging, schema.EventCondenseFailed, schema.EventSlidingWindowTruncation}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			conv := newConv(c.sum, schema.Profile{ID: "demo", ContextWindow: 16000, MaxTokens: 1024})
			for i := range c.messages {
				_, err := conv.Append(ctx, turnOf(i, 5))
				mustNoErr(t, err)
			}
			before := len(conv.Effective())
			evs, err := conv.Apply(ctx, schema.Input{Kind: schema.KindOverflow, ID: msgID(90), ConversationID: testConv, TS: 5000})
			mustNoErr(t, err)
			if got := types(evs); !reflect.DeepEqual(got, c.want) {
				t.Fatalf("events %v, want %v", got, c.want)
			}
			last, _ := evs[len(evs)-1].(*schema.CondenseFailed)
			switch {
			case c.condenseE == "" && last != nil:
				t.Fatalf("a reduction ended in %+v", last)
			case c.condenseE != "" && (last == nil || last.Error != schema.ReasonNothingToReduce || last.CondenseError != c.condenseE ||
				!strings.Contains(last.Message, "nothing is left to truncate")):
				t.Fatalf("last event %+v, want nothing_to_reduce after %s", evs[len(evs)-1], c.condenseE)
			case c.condenseE != "" && len(conv.Effective()) != before:
				t.Fatalf("nothing reduced, yet the effective history went from %d to %d messages", before, len(conv.Effective()))
			}
		})
	}
}
