package engine

import (
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/ctxpipe/ctxpipe/schema"
)

// Replaying several Changes in one call is replaying them one by one: the
// same history, whatever mix of deletes, inserts (at the end or before a
// message) and tags they hold, and the caller's slice is left as it was.
func TestApplyManyIsApplyInTurn(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 300; round++ {
		base := msgs(rng.IntN(12))
		next := 1000
		var chs []*schema.Changes
		cur := slices.Clone(base)
		for n := rng.IntN(6); n > 0; n-- {
			ch := randomChanges(rng, cur, &next)
			chs = append(chs, ch)
			cur = Apply(cur, ch)
		}
		orig := slices.Clone(base)
		got := Apply(base, chs...)
		if !reflect.DeepEqual(got, cur) && !(len(got) == 0 && len(cur) == 0) {
			t.Fatalf("round %d: Apply of %d changes at once gave %q, one by one %q", round, len(chs), join(got), join(cur))
		}
		if !reflect.DeepEqual(base, orig) {
			t.Fatalf("round %d: the caller's history changed: %q, was %q", round, join(base), join(orig))
		}
	}
}

// randomChanges edits h: some deletes, inserts at the end or before a
// message, and tags on messages old and new.
func randomChanges(rng *rand.Rand, h []schema.Message, next *int) *schema.Changes {
	ch := &schema.Changes{}
	for _, m := range h {
		if rng.IntN(8) == 0 {
			ch.Delete = append(ch.Delete, m.ID)
		}
	}
	for n := rng.IntN(3); n > 0; n-- {
		*next++
		ins := schema.Insertion{Message: textMsg(*next, "inserted")}
		if len(h) > 0 && rng.IntN(2) == 0 {
			ins.Before = h[rng.IntN(len(h))].ID
		}
		ch.Insert = append(ch.Insert, ins)
	}
	targets := ids(h)
	for _, ins := range ch.Insert {
		targets = append(targets, ins.Message.ID)
	}
	for n := rng.IntN(3); n > 0 && len(targets) > 0; n-- {
		f := schema.TagCondenseParent
		if rng.IntN(2) == 0 {
			f = schema.TagTruncationParent
		}
		ch.Tags = append(ch.Tags, schema.TagChange{MessageID: targets[rng.IntN(len(targets))], Field: f, Value: "p"})
	}
	return ch
}
