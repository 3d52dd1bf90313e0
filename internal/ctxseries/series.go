// Package ctxseries rebuilds a conversation's context size turn by turn,
// the data of `publisher plot` and of the dashboard's plot: one pure
// function over the stored history and the events, so both draw the same.
package ctxseries

import (
	"sort"

	"github.com/ctxpipe/ctxpipe/schema"
)

// Point is the context size after turn X; Kind marks a condense, a
// truncation or a masking that brought it down to Y at that turn.
type Point struct {
	X    int              `json:"x"`
	Y    int              `json:"y"`
	Kind schema.EventType `json:"kind,omitempty"`
}

// Series rebuilds the context size turn by turn from the stored turns
// (their counts, or the provider's usage) and the condense, truncation and
// masking events, which carry the exact figures before and after each
// reduction. Masked stand-ins are synthetic, so each turn counts once.
func Series(msgs []schema.Message, evs []schema.Event) []Point {
	var turns []schema.Message
	for _, m := range msgs {
		if !m.Synthetic() {
			turns = append(turns, m)
		}
	}
	sort.SliceStable(turns, func(i, j int) bool { return turns[i].TS < turns[j].TS })
	at := map[string]int{} // input id → turn index
	for i, m := range turns {
		at[m.ID] = i
	}
	undone := map[string]bool{} // condenses, truncations and maskings a rewind removed
	for _, e := range evs {
		if r, ok := e.(*schema.Rewind); ok {
			for _, ids := range [][]string{r.RemovedCondenseIDs, r.RemovedTruncationIDs, r.RemovedMaskIDs} {
				for _, id := range ids {
					undone[id] = true
				}
			}
		}
	}
	byTurn := map[int][]schema.Event{}
	for _, e := range evs {
		switch e := e.(type) {
		case *schema.CondenseContext:
			if undone[e.CondenseID] {
				continue
			}
		case *schema.SlidingWindowTruncation:
			if undone[e.TruncationID] {
				continue
			}
		case *schema.ToolResultsMasked:
			if undone[e.MaskID] {
				continue
			}
		}
		h := e.Header()
		i, ok := at[h.InputID]
		if !ok { // a control input (manual condense, overflow): place it by time
			i = sort.Search(len(turns), func(k int) bool { return turns[k].TS > h.TS }) - 1
			if i < 0 {
				continue
			}
		}
		byTurn[i] = append(byTurn[i], e)
	}
	out := []Point{} // never null in JSON
	running := 0
	for i, m := range turns {
		running += m.Tokens
		if m.Usage != nil {
			running = m.Usage.Total()
		}
		for _, e := range byTurn[i] {
			var prev, next int
			switch e := e.(type) {
			case *schema.CondenseContext:
				prev, next = e.PrevContextTokens, e.NewContextTokens
			case *schema.SlidingWindowTruncation:
				prev, next = e.PrevContextTokens, e.NewContextTokens
			case *schema.ToolResultsMasked:
				prev, next = e.PrevContextTokens, e.NewContextTokens
			default:
				continue
			}
			out = append(out, Point{X: i + 1, Y: prev}, Point{X: i + 1, Y: next, Kind: e.Header().Type})
			running = next
		}
		// A turn gets its own point unless a reduction at it made two:
		// events that are not reductions (a failed condense, a rejected
		// control input placed here by time) leave it one, even on the
		// first turn, where out is still empty.
		if len(out) == 0 || out[len(out)-1].X != i+1 {
			out = append(out, Point{X: i + 1, Y: running})
		}
	}
	return out
}
