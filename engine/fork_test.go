package engine

import (
	"context"
	"reflect"
	"testing"

	"github.com/ctxpipe/ctxpipe/schema"
)

// A turn naming the conversation it continues records the link in the
// state and announces it once, before any reduction the same turn causes;
// a later turn naming another leaves the link as it is.
func TestEngineRecordsTheConversationContinued(t *testing.T) {
	c := newConv(&fixedSummarizer{text: "short"}, smallProfile())
	ctx := context.Background()
	first := turnOf(0, 100)
	first.ContinuesFrom = "task-41"
	evs, err := c.Append(ctx, first)
	mustNoErr(t, err)
	if got := types(evs); !reflect.DeepEqual(got, []schema.EventType{schema.EventConversationForked}) {
		t.Fatalf("events %v, want conversation_forked", got)
	}
	f := evs[0].(*schema.ConversationForked)
	if f.ContinuesFrom != "task-41" || f.ConversationID != testConv || f.InputID != first.ID ||
		f.ID != DeriveID(first.ID, "event/conversation_forked") || f.TS != first.TS {
		t.Fatalf("event %+v", f)
	}
	if c.State.ContinuesFrom != "task-41" {
		t.Fatalf("state continues from %q", c.State.ContinuesFrom)
	}
	for i := 1; i < 7; i++ {
		turn := turnOf(i, 100)
		if i == 3 {
			turn.ContinuesFrom = "task-40"
		}
		evs, err := c.Append(ctx, turn)
		mustNoErr(t, err)
		if len(evs) != 0 {
			t.Fatalf("turn %d: events %v", i, types(evs))
		}
	}
	if c.State.ContinuesFrom != "task-41" {
		t.Fatalf("a later turn changed the link to %q", c.State.ContinuesFrom)
	}
	// A turn that names it and crosses the threshold: the link is
	// announced first, then the reduction.
	c = newConv(&fixedSummarizer{text: "short"}, smallProfile())
	for i := range 7 {
		_, err := c.Append(ctx, turnOf(i, 100))
		mustNoErr(t, err)
	}
	last := turnOf(7, 100)
	last.ContinuesFrom = "task-41"
	evs, err = c.Append(ctx, last)
	mustNoErr(t, err)
	want := []schema.EventType{schema.EventConversationForked, schema.EventContextManaging, schema.EventCondenseContext}
	if got := types(evs); !reflect.DeepEqual(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
}
