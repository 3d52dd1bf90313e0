package dashboard

import (
	"encoding/json"
	"strings"

	"github.com/ctxpipe/ctxpipe/engine"
	"github.com/ctxpipe/ctxpipe/internal/ctxseries"
	"github.com/ctxpipe/ctxpipe/schema"
)

// Point is one point of the plot (internal/ctxseries, shared with
// `publisher plot`).
type Point = ctxseries.Point

// Series is the plot's data: the context size turn by turn, with every
// condense, truncation and masking a rewind did not undo (ctxseries.Series,
// the same function `publisher plot` draws).
func Series(msgs []schema.Message, evs []schema.Event) []Point { return ctxseries.Series(msgs, evs) }

// HistoryItem is one stored message as the conversation page shows it.
type HistoryItem struct {
	ID     string      `json:"id"`
	TS     int64       `json:"ts"`
	Role   schema.Role `json:"role"`
	Agent  string      `json:"agent,omitempty"`
	Tokens int         `json:"tokens"`
	// Kind is "turn", "summary", "ack" (a summary's acknowledgement),
	// "marker" (a truncation marker) or "mask" (a masked stand-in).
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
		if m.IsSummary && m.CondenseID != "" && !m.IsSummaryAck {
			byCondense[m.CondenseID] = m.ID
		}
		if m.IsTruncationMarker && m.TruncationID != "" {
			byTruncation[m.TruncationID] = m.ID
		}
	}
	effective := map[string]bool{}
	for _, m := range engine.EffectiveHistory(msgs) {
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
		case m.IsSummaryAck:
			it.Kind, it.Tag = "ack", m.CondenseID
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
