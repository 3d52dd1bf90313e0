package engine

import (
	"github.com/ctxpipe/ctxpipe/prompts"
	"github.com/ctxpipe/ctxpipe/schema"
)

// planPreserveFraction is Gemini CLI's compression: summarize the oldest 70 %
// of the effective history's characters, split at a SplitPoint boundary, and
// put a user summary before what is kept, followed by an assistant
// acknowledgement (Gemini's model turn after its snapshot) unless the kept
// part opens with an assistant message. The summary carries the first
// message's <command> blocks, as fresh_start's does, since the first message
// is among the summarized.
//
// Kept messages (MustKeep) before the split stay visible before the summary.
func planPreserveFraction(msgs []schema.Message, id string, keep map[string]bool) (*CondensePlan, error) {
	eff := EffectiveHistory(msgs)
	split := SplitPoint(eff, 1-PreserveFraction)
	if split == 0 {
		return nil, schema.Errorf(schema.ReasonNotEnoughMessages, "no boundary to split at")
	}
	// What the condense would hide besides summaries and their
	// acknowledgements: nothing new when only the last summary (with the
	// messages that must stay anyway, the task say) lies before the split.
	hides, summaries := 0, 0
	for i := range eff[:split] {
		switch m := &eff[i]; {
		case keep[m.ID]:
		case m.IsCondenseSummary():
			summaries++
		case !m.IsSummaryAck:
			hides++
		}
	}
	switch {
	case hides == 0 && summaries > 0:
		return nil, schema.Errorf(schema.ReasonCondensedRecently, "only the last summary would be summarized")
	case hides == 0:
		return nil, schema.Errorf(schema.ReasonNotEnoughMessages, "every message before the split must stay")
	}
	plan := &CondensePlan{Strategy: schema.StrategyPreserveFraction}
	plan.Request.Messages = eff[:split]
	commands := ""
	if len(msgs) > 0 && !keep[msgs[0].ID] {
		commands = commandBlocks(msgs[0])
	}
	plan.finish = func(text string, count func(schema.Content) int) Condensed {
		ed := newEditor(msgs)
		at, n, visible := len(ed.msgs), 0, idSet(eff)
		for i := range ed.msgs {
			if split < len(eff) && ed.msgs[i].ID == eff[split].ID {
				at = i
				break
			}
			n += condenseAt(ed, i, id, keep, visible)
		}
		ref, ts := &msgs[len(msgs)-1], msgs[len(msgs)-1].TS // at the end: the last ts (ts.go)
		if at < len(ed.msgs) {
			ref, ts = &ed.msgs[at], justBefore(ed.msgs[at].TS)
		}
		sum := summaryMessage(id, ref, schema.RoleUser, ts, summaryContent(text, commands), count)
		ed.insertAt(at, sum)
		if split == len(eff) || eff[split].Role != schema.RoleAssistant {
			ack := summaryMessage(id, ref, schema.RoleAssistant, ts, schema.TextContent(prompts.SummaryAck), count)
			ack.ID, ack.IsSummaryAck = DeriveID(id, "ack"), true
			ed.insertAt(at+1, ack)
		}
		return Condensed{Changes: ed.changes(), History: ed.msgs, Summary: sum, MessagesCondensed: n}
	}
	return plan, nil
}

// SplitPoint is Gemini's findCompressSplitPoint, extended to tool-calling
// agents: the index of the first boundary at which the characters before it
// reach fraction of the total. A boundary is a user message without tool
// results (Gemini's rule) or an assistant message right after a complete
// call/result exchange: in an agent run every user turn after the first
// holds only tool results, so Gemini's rule alone finds nothing to split at.
// No boundary falls between a call and its results. If none reaches the
// fraction, everything is compressed when the last message is an assistant
// message without tool calls; otherwise the last boundary is used (0:
// nothing can be compressed). Characters are counted as Gemini counts them
// (geminiChars).
func SplitPoint(msgs []schema.Message, fraction float64) int {
	chars := make([]int, len(msgs))
	total := 0
	for i := range msgs {
		chars[i] = geminiChars(&msgs[i])
		total += chars[i]
	}
	target := float64(total) * fraction
	last, cum := 0, 0
	var open []string // calls of the latest assistant turn still unanswered
	for i := range msgs {
		m := &msgs[i]
		boundary := false
		switch m.Role {
		case schema.RoleUser:
			boundary = !m.Content.HasBlock(schema.BlockToolResult)
		case schema.RoleAssistant:
			boundary = i > 0 && len(open) == 0 && msgs[i-1].Content.HasBlock(schema.BlockToolResult)
		}
		if boundary {
			if float64(cum) >= target {
				return i
			}
			last = i
		}
		open = nextToolUseIDs(open, m)
		cum += chars[i]
	}
	if n := len(msgs); n > 0 && msgs[n-1].Role == schema.RoleAssistant && !msgs[n-1].Content.HasBlock(schema.BlockToolUse) {
		return n
	}
	return last
}

// geminiChars is Gemini's measure of a message, JSON.stringify(content)
// .length: the message as a Gemini Content ({"role": "user" or "model",
// "parts": [...]}, a text block as a {"text": ...} part, any other block as
// its own JSON), in UTF-16 code units as JavaScript counts a string's
// length, not in bytes: text in CJK scripts weighs three times less than
// its UTF-8.
func geminiChars(m *schema.Message) int {
	role := "user"
	if m.Role == schema.RoleAssistant {
		role = "model"
	}
	parts := []any{}
	for _, b := range m.Content.BlocksOf() {
		if b.Type == schema.BlockText {
			parts = append(parts, struct {
				Text string `json:"text"`
			}{b.Text})
			continue
		}
		parts = append(parts, b)
	}
	js, _ := schema.Marshal(struct {
		Role  string `json:"role"`
		Parts []any  `json:"parts"`
	}{role, parts})
	n := 0
	for _, r := range string(js) {
		n++
		if r >= 0x10000 { // a surrogate pair
			n++
		}
	}
	return n
}
