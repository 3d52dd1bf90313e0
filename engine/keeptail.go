package engine

import (
	"github.com/ctxpipe/ctxpipe/prompts"
	"github.com/ctxpipe/ctxpipe/schema"
)

// planKeepTail is Roo ≤ 3.42: keep the first message and the last three,
// summarize what lies between since the last summary, and insert an
// assistant summary just before the kept tail.
func planKeepTail(msgs []schema.Message, id string, keep map[string]bool) (*CondensePlan, error) {
	keepStart := max(len(msgs)-NMessagesToKeep, 0)
	since := sinceLastSummary(msgs[:keepStart], msgs)
	if len(since) <= 1 {
		return nil, schema.Errorf(schema.ReasonNotEnoughMessages, "%d messages to summarize; need at least 2 besides the last %d", len(since), NMessagesToKeep)
	}
	for i := keepStart; i < len(msgs); i++ {
		if msgs[i].IsCondenseSummary() {
			return nil, schema.Errorf(schema.ReasonCondensedRecently, "a summary is among the last %d messages", NMessagesToKeep)
		}
	}
	// The summary can only shrink the context by hiding something: when
	// every visible message it would hide must stay (pinned, the task, the
	// latest instruction), it is refused before the model is asked, as the
	// other strategies refuse it, rather than paid for, found to have made
	// the context grow, and latched.
	visible := idSet(EffectiveHistory(msgs))
	hideable := 0
	for i := 1; i < keepStart; i++ {
		m := &msgs[i]
		if m.CondenseParent == "" && !keep[m.ID] && visible[m.ID] && !m.IsTruncationMarker {
			hideable++
		}
	}
	if hideable == 0 {
		return nil, schema.Errorf(schema.ReasonNotEnoughMessages, "every message before the last %d must stay", NMessagesToKeep)
	}
	toolUses, reasoning := toolBlocksToPreserve(msgs, keepStart, keep)
	plan := &CondensePlan{Strategy: schema.StrategyKeepTail}
	// The span may end with calls whose results are kept: the summarizer
	// sees those results too, and a synthetic one for a call still pending.
	plan.Request.Messages = withDeferredToolResults(withTailResults(visibleOf(since, msgs), msgs[keepStart:]))
	plan.finish = func(text string, count func(schema.Content) int) Condensed {
		content := []schema.Block{{Type: schema.BlockReasoning, Text: prompts.SyntheticReasoning}}
		content = append(content, reasoning...)
		content = append(content, schema.Block{Type: schema.BlockText, Text: text})
		content = append(content, toolUses...)
		kept := &msgs[keepStart]
		ed := newEditor(msgs)
		n, visible := 0, idSet(EffectiveHistory(msgs))
		for i := 1; i < keepStart; i++ {
			n += condenseAt(ed, i, id, keep, visible)
		}
		sum := summaryMessage(id, kept, schema.RoleAssistant, justBefore(kept.TS), schema.BlockContent(content...), count)
		ed.insertAt(keepStart, sum)
		return Condensed{Changes: ed.changes(), History: ed.msgs, Summary: sum, MessagesCondensed: n}
	}
	return plan, nil
}

// sinceLastSummary is Roo's getMessagesSinceLastSummary over head: from the
// last summary on, with the conversation's first message put in front when
// that summary is an assistant message (a request must start with a user turn).
func sinceLastSummary(head, all []schema.Message) []schema.Message {
	last := -1
	for i := range head {
		if head[i].IsCondenseSummary() {
			last = i
		}
	}
	if last < 0 {
		return head
	}
	since := head[last:]
	if head[last].Role == schema.RoleAssistant && len(all) > 0 {
		since = append([]schema.Message{all[0]}, since...)
	}
	return since
}

// toolBlocksToPreserve is Roo's getKeepMessagesWithToolBlocks, made to hold
// for agents that answer parallel calls with one result turn each: every
// call that the condense hides and that a kept message answers, or whose
// result is still to come, goes into the summary (with the reasoning blocks
// of the turn that made it), however far before the cut it was made. No
// tool_result in the kept tail, or arriving later, then loses its call.
//
// A call in a message that stays visible anyway (kept, see MustKeep) needs
// no copy.
func toolBlocksToPreserve(msgs []schema.Message, keepStart int, keep map[string]bool) (toolUses, reasoning []schema.Block) {
	if keepStart <= 0 || keepStart >= len(msgs) {
		return nil, nil
	}
	want := openToolUses(msgs)
	if want == nil {
		want = map[string]bool{}
	}
	for i := keepStart; i < len(msgs); i++ {
		for _, b := range msgs[i].Content.Blocks {
			if b.Type == schema.BlockToolResult {
				want[b.ToolUseID] = true
			}
		}
	}
	for i := range msgs { // a call in the tail, or kept, stays visible
		if i < keepStart && !keep[msgs[i].ID] {
			continue
		}
		for _, b := range msgs[i].Content.Blocks {
			if b.Type == schema.BlockToolUse {
				delete(want, b.ID)
			}
		}
	}
	// The first message stays visible unless something hid it already; a
	// call there needs no copy (a copy would repeat its id).
	stop := 1
	if summaries, markers := liveIDs(msgs); hidden(&msgs[0], summaries, markers) {
		stop = 0
	}
	// Search back from the cut; a reused id is answered by its latest call.
	type carry struct{ uses, reasoning []schema.Block }
	var found []carry // newest turn first
	for i := keepStart - 1; i >= stop && len(want) > 0; i-- {
		var c carry
		for _, b := range msgs[i].Content.Blocks {
			if b.Type == schema.BlockToolUse && want[b.ID] {
				c.uses = append(c.uses, b)
				delete(want, b.ID)
			}
		}
		if len(c.uses) == 0 {
			continue
		}
		for _, b := range msgs[i].Content.Blocks {
			if b.Type == schema.BlockReasoning {
				c.reasoning = append(c.reasoning, b)
			}
		}
		found = append(found, c)
	}
	for k := len(found) - 1; k >= 0; k-- {
		toolUses = append(toolUses, found[k].uses...)
		reasoning = append(reasoning, found[k].reasoning...)
	}
	return toolUses, reasoning
}
