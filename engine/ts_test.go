package engine

import (
	"context"
	"math"
	"testing"

	"github.com/ctxpipe/ctxpipe/schema"
)

// Turns may carry any ts from 1 to MaxInt64: the summaries and markers
// placed beside them must too, never 0 or a wrapped-around negative, under
// every strategy.
func TestSummaryAndMarkerTimestampsAtTheEnds(t *testing.T) {
	ends := map[string]func(i int) int64{
		"every ts 1":        func(int) int64 { return 1 },
		"ts up to MaxInt64": func(i int) int64 { return math.MaxInt64 - int64(max(0, 3-i)) },
	}
	for name, tsOf := range ends {
		for _, s := range []schema.Strategy{schema.StrategyKeepTail, schema.StrategyFreshStart, schema.StrategyPreserveFraction} {
			t.Run(name+"/"+string(s), func(t *testing.T) {
				p := smallProfile()
				p.Strategy = s
				c := newConv(&fixedSummarizer{text: "summary"}, p)
				for i := range 40 {
					turn := turnOf(i, 60)
					turn.TS = tsOf(i)
					if _, err := c.Append(context.Background(), turn); err != nil {
						t.Fatal(err)
					}
				}
				if c.State.Condensations == 0 {
					t.Fatal("nothing condensed: the test proves nothing")
				}
				for _, m := range c.Messages {
					if m.TS < 1 {
						t.Fatalf("%s message %s has ts %d", map[bool]string{true: "summary", false: "turn"}[m.IsSummary], m.ID, m.TS)
					}
				}
			})
		}
		t.Run(name+"/truncation", func(t *testing.T) {
			h := msgs(11)
			for i := range h {
				h[i].TS = tsOf(i)
			}
			tr, ok := PlanTruncation(h, 0.5, "trunc-1", lenCount)
			if !ok {
				t.Fatal("nothing truncated")
			}
			for _, m := range tr.History {
				if m.TS < 1 {
					t.Fatalf("message %s (marker %v) has ts %d", m.ID, m.IsTruncationMarker, m.TS)
				}
			}
		})
	}
}

func TestJustBefore(t *testing.T) {
	for _, c := range []struct{ ts, before int64 }{
		{1, 1}, {2, 1}, {1000, 999}, {math.MaxInt64, math.MaxInt64 - 1},
	} {
		if got := justBefore(c.ts); got != c.before {
			t.Errorf("justBefore(%d) = %d, want %d", c.ts, got, c.before)
		}
	}
}
