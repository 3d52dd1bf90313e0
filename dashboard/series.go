package dashboard

import (
	"encoding/json"
	"sort"
	"strings"

	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/stages"
)

// Point is the context size after turn X; Kind marks a condense or a
// truncation that brought it down to Y at that turn (its previous figure is
// the point before, at the same X).
type Point struct {
	X    int              `json:"x"`
	Y    int              `json:"y"`
	Kind schema.EventType `json:"kind,omitempty"`
}

// Series rebuilds a conversation's context size turn by turn from its full
// stored history (the turns' counts, or the provider's usage) and its
// events (the condenses' and truncations' exact figures before and after),
// leaving out the reductions a rewind undid. It is the data of `publisher
// plot` (cmd/publisher/plot.go, contextSeries), computed the same way; the
// publisher is a main package, so it cannot be imported from here.
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
	undone := map[string]bool{} // condenses and truncations a rewind removed
	for _, e := range evs {
		if r, ok := e.(*schema.Rewind); ok {
			for _, id := range append(r.RemovedCondenseIDs, r.RemovedTruncationIDs...) {
				undone[id] = true
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
		default:
			continue
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
	out := []Point{}
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
			}
			out = append(out, Point{X: i + 1, Y: prev}, Point{X: i + 1, Y: next, Kind: e.Header().Type})
			running = next
		}
		if len(byTurn[i]) == 0 {
			out = append(out, Point{X: i + 1, Y: running})
		}
	}
	return out
}

// HistoryItem is one stored message as the conversation page shows it.
type HistoryItem struct {
	ID     string      `json:"id"`
	TS     int64       `json:"ts"`
	Role   schema.Role `json:"role"`
	Agent  string      `json:"agent,omitempty"`
	Tokens int         `json:"tokens"`
	// Kind is "turn", "summary", "marker" (a truncation marker) or "mask"
	// (a masked stand-in).
	Kind string `json:"kind"`
	// Effective: the message is in what the agent sends its model now.
	Effective bool `json:"effective"`
	// HiddenBy is the id of the summary, marker or stand-in that hides the
	// message ("" when none does); the page nests it there.
	HiddenBy string `json:"hidden_by,omitempty"`
	// Tag is the condense, truncation or mask id a summary, marker or
	// stand-in carries.
	Tag  string `json:"tag,omitempty"`
	Text string `json:"text"`
}

// History lists the full history in position order, each message marked
// effective or not and linked to the summary or marker that hides it, and
// counts the hidden ones (as store.HiddenCount does).
func History(msgs []schema.Message) (items []HistoryItem, hidden int) {
	byCondense, byTruncation := map[string]string{}, map[string]string{}
	for _, m := range msgs {
		if m.IsSummary && m.CondenseID != "" {
			byCondense[m.CondenseID] = m.ID
		}
		if m.IsTruncationMarker && m.TruncationID != "" {
			byTruncation[m.TruncationID] = m.ID
		}
	}
	effective := map[string]bool{}
	for _, m := range stages.EffectiveHistory(msgs) {
		effective[m.ID] = true
	}
	items = make([]HistoryItem, 0, len(msgs))
	for i := range msgs {
		m := &msgs[i]
		it := HistoryItem{ID: m.ID, TS: m.TS, Role: m.Role, Agent: m.AgentID, Tokens: m.Tokens,
			Kind: "turn", Effective: effective[m.ID], Text: text(m.Content)}
		switch {
		case m.IsMask():
			it.Kind, it.Tag = "mask", m.CondenseID
		case m.IsSummary:
			it.Kind, it.Tag = "summary", m.CondenseID
		case m.IsTruncationMarker:
			it.Kind, it.Tag = "marker", m.TruncationID
		}
		// A summary hides before a marker does, as the store counts it.
		if id, ok := byCondense[m.CondenseParent]; ok && m.CondenseParent != "" {
			it.HiddenBy = id
		} else if id, ok := byTruncation[m.TruncationParent]; ok && m.TruncationParent != "" {
			it.HiddenBy = id
		}
		if it.HiddenBy != "" {
			hidden++
		}
		items = append(items, it)
	}
	return items, hidden
}

// text renders content for reading: text as is, tool calls and results as
// one bracketed line each.
func text(c schema.Content) string {
	if !c.IsBlocks {
		return c.Text
	}
	var b strings.Builder
	for i, bl := range c.Blocks {
		if i > 0 {
			b.WriteString("\n")
		}
		switch bl.Type {
		case schema.BlockText:
			b.WriteString(bl.Text)
		case schema.BlockReasoning:
			b.WriteString("[reasoning] " + bl.Text)
		case schema.BlockToolUse:
			b.WriteString("[tool_use " + bl.Name + "] " + compact(bl.Input))
		case schema.BlockToolResult:
			label := "[tool_result]"
			if bl.IsError {
				label = "[tool_result error]"
			}
			inner := ""
			if bl.Content != nil {
				inner = text(*bl.Content)
			}
			b.WriteString(label + " " + inner)
		case schema.BlockImage:
			b.WriteString("[image]")
		default:
			b.WriteString("[" + string(bl.Type) + "]")
		}
	}
	return b.String()
}

func compact(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	return string(raw)
}
