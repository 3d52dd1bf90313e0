package engine

import "github.com/ctxpipe/ctxpipe/schema"

// planFreshStart is Roo ≥ 3.43: everything so far is tagged and a user
// summary is appended; the model then starts fresh from the summary. Two
// departures keep it safe: at least two messages must follow the last
// summary (Roo's guard against condense loops), and a last assistant turn
// whose calls still wait for results stays visible after the summary, so the
// results the agent sends next keep their calls.
//
// Kept messages (MustKeep: the task, the latest instruction, pinned ones)
// stay visible before the summary. They count for Roo's two-message guard,
// but something else must be hidden too: two messages with no summary yet,
// one after a summary (which is summarized again).
func planFreshStart(msgs []schema.Message, id string, keep map[string]bool, maskResults bool) (*CondensePlan, error) {
	keepFrom := pendingTurn(msgs)
	pending := idSet(msgs[keepFrom:])
	eff := EffectiveHistory(msgs)
	span := eff[:0] // eff is ours: filter in place
	// last is the last summary in span; since counts the agent messages
	// after it, hideable those of them that need not stay.
	last, since, hideable := -1, 0, 0
	for _, m := range eff {
		if pending[m.ID] {
			continue
		}
		span = append(span, m)
		switch {
		case m.IsCondenseSummary():
			last, since, hideable = len(span)-1, 0, 0
		case !m.Synthetic() || m.IsMask():
			since++
			if !keep[m.ID] {
				hideable++
			}
		}
	}
	// Roo's guard: after a summary, two new messages are needed; fewer is
	// "condensed recently", as Roo words it. The condense must also hide
	// something besides the summary: with no summary yet, two messages.
	switch {
	case last >= 0 && since == 0:
		return nil, schema.Errorf(schema.ReasonCondensedRecently, "nothing was said since the last summary")
	case last >= 0 && since < 2:
		return nil, schema.Errorf(schema.ReasonCondensedRecently, "%d message since the last summary; need at least 2", since)
	case last >= 0 && hideable == 0:
		return nil, schema.Errorf(schema.ReasonNotEnoughMessages, "every message since the last summary must stay")
	case last < 0 && hideable < 2:
		return nil, schema.Errorf(schema.ReasonNotEnoughMessages, "%d messages to summarize; need at least 2", hideable)
	}
	plan := &CondensePlan{Strategy: schema.StrategyFreshStart}
	req := withDeferredToolResults(span)
	plan.Request.Source = req // unmasked: the files touched come from whole inputs
	if maskResults {
		req = maskRequest(req, msgs)
	}
	plan.Request.Messages = toolBlocksAsText(req)
	commands := ""
	if len(msgs) > 0 && !keep[msgs[0].ID] {
		commands = commandBlocks(msgs[0])
	}
	plan.finish = func(text string, count func(schema.Content) int) Condensed {
		ed := newEditor(msgs)
		n, visible := 0, idSet(EffectiveHistory(msgs))
		for i := 0; i < keepFrom; i++ {
			n += condenseAt(ed, i, id, keep, visible)
		}
		ref, ts := &msgs[len(msgs)-1], msgs[len(msgs)-1].TS // at the end: the last ts (ts.go)
		if keepFrom < len(msgs) {
			ref, ts = &msgs[keepFrom], justBefore(msgs[keepFrom].TS)
		}
		sum := summaryMessage(id, ref, schema.RoleUser, ts, summaryContent(text, commands), count)
		ed.insertAt(keepFrom, sum)
		return Condensed{Changes: ed.changes(), History: ed.msgs, Summary: sum, MessagesCondensed: n}
	}
	return plan, nil
}

// pendingTurn is the index of the last assistant turn when some of its calls
// still wait for results and it is visible; len(msgs) otherwise. A condense
// keeps it, and the result turns after it, in the effective history.
func pendingTurn(msgs []schema.Message) int {
	if len(openToolUses(msgs)) == 0 {
		return len(msgs)
	}
	summaries, markers := liveIDs(msgs)
	for i := len(msgs) - 1; i >= 0; i-- {
		m := &msgs[i]
		if m.Role != schema.RoleAssistant || m.Synthetic() {
			continue
		}
		if hidden(m, summaries, markers) {
			return len(msgs)
		}
		return i
	}
	return len(msgs)
}
