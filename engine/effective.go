package engine

import "github.com/ctxpipe/ctxpipe/schema"

// EffectiveHistory is what the model is sent (Roo's getEffectiveApiHistory).
// A message is hidden while its condense_parent names a summary that exists
// or its truncation_parent names a marker that exists; a tag whose summary or
// marker is gone (rewound) is ignored, so the message is visible again.
// Tool results whose tool_use is not in an earlier effective message are
// dropped (and a user message left empty by that is dropped too), so the
// effective history never sends an orphaned tool_result, whatever was hidden.
//
// Roo v2 (fresh_start) slices from the last summary instead of filtering; the
// two agree because a fresh_start summary tags every earlier message, so one
// rule serves all three strategies. Stored messages are never modified: the
// result shares unchanged messages and copies the ones it edits.
func EffectiveHistory(msgs []schema.Message) []schema.Message {
	out := make([]schema.Message, 0, len(msgs))
	walkEffective(msgs, func(m *schema.Message, answered map[string]bool) {
		if answered == nil {
			out = append(out, *m)
			return
		}
		kept := make([]schema.Block, 0, len(m.Content.Blocks))
		for _, b := range m.Content.Blocks {
			if b.Type != schema.BlockToolResult || answered[b.ToolUseID] {
				kept = append(kept, b)
			}
		}
		c := *m
		c.Content = schema.BlockContent(kept...)
		out = append(out, c)
	})
	return out
}

// walkEffective visits each message of the effective history in order. When
// the message loses some orphaned tool results (it keeps at least one
// block), answered holds the calls made so far, to tell which results stay;
// otherwise it is nil and the message goes as stored. The walk allocates only
// its bookkeeping, so counting a context costs no copy of the history.
func walkEffective(msgs []schema.Message, visit func(m *schema.Message, answered map[string]bool)) {
	summaries, markers := liveIDs(msgs)
	seenToolUse := map[string]bool{}
	for i := range msgs {
		m := &msgs[i]
		if hidden(m, summaries, markers) {
			continue
		}
		if m.Role == schema.RoleAssistant {
			for _, b := range m.Content.Blocks {
				if b.Type == schema.BlockToolUse {
					seenToolUse[b.ID] = true
				}
			}
			visit(m, nil)
			continue
		}
		if !m.Content.HasBlock(schema.BlockToolResult) {
			visit(m, nil)
			continue
		}
		kept := 0
		for _, b := range m.Content.Blocks {
			if b.Type != schema.BlockToolResult || seenToolUse[b.ToolUseID] {
				kept++
			}
		}
		switch kept {
		case 0: // only orphaned results: the message goes
		case len(m.Content.Blocks):
			visit(m, nil)
		default:
			visit(m, seenToolUse)
		}
	}
}

// effectiveTokens is ContextTokens(systemTokens, EffectiveHistory(msgs))
// without building the history.
func effectiveTokens(systemTokens int, msgs []schema.Message) int {
	n := systemTokens
	walkEffective(msgs, func(m *schema.Message, _ map[string]bool) { n += m.Tokens })
	return n
}

// liveIDs returns the condense ids of stored summaries and the truncation ids
// of stored markers.
func liveIDs(msgs []schema.Message) (summaries, markers map[string]bool) {
	summaries, markers = map[string]bool{}, map[string]bool{}
	for i := range msgs {
		if msgs[i].IsSummary && msgs[i].CondenseID != "" {
			summaries[msgs[i].CondenseID] = true
		}
		if msgs[i].IsTruncationMarker && msgs[i].TruncationID != "" {
			markers[msgs[i].TruncationID] = true
		}
	}
	return summaries, markers
}

func hidden(m *schema.Message, summaries, markers map[string]bool) bool {
	return (m.CondenseParent != "" && summaries[m.CondenseParent]) ||
		(m.TruncationParent != "" && markers[m.TruncationParent])
}

// Cleanup clears parent tags that name a summary or marker no longer stored
// (Roo's cleanupAfterTruncation). It never removes a message.
func Cleanup(msgs []schema.Message) []schema.TagChange {
	summaries, markers := liveIDs(msgs)
	var out []schema.TagChange
	for i := range msgs {
		m := &msgs[i]
		if m.CondenseParent != "" && !summaries[m.CondenseParent] {
			out = append(out, schema.TagChange{MessageID: m.ID, Field: schema.TagCondenseParent})
		}
		if m.TruncationParent != "" && !markers[m.TruncationParent] {
			out = append(out, schema.TagChange{MessageID: m.ID, Field: schema.TagTruncationParent})
		}
	}
	return out
}

// ContextTokens is the local count of a context: the system prompt plus
// every effective message's stored count.
func ContextTokens(systemTokens int, effective []schema.Message) int {
	n := systemTokens
	for i := range effective {
		n += effective[i].Tokens
	}
	return n
}
