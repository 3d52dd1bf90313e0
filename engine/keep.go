package engine

import (
	"fmt"
	"strings"

	"github.com/ctxpipe/ctxpipe/schema"
)

// What must survive a reduction: pinned messages, and with the
// profile's keep_task the first user message (the task) and the latest user
// instruction. Each stays verbatim in the effective history: no summary
// stands in for it, no truncation hides it, and masking leaves it whole.

// MustKeep returns the ids of the visible messages that no reduction may
// hide: the pinned ones (pins overrides each message's own flag, see
// ConversationState.IsPinned) and, when p keeps the task, the first user
// message and the latest user instruction (the last user message that says
// something besides tool results). The set is closed over tool exchanges: a
// kept message's results keep the calls they answer, and a kept call keeps
// its results, so keeping a message never orphans a tool result.
func MustKeep(msgs []schema.Message, pins map[string]bool, p *schema.Profile) map[string]bool {
	summaries, markers := liveIDs(msgs)
	st := schema.ConversationState{Pins: pins}
	keep := map[string]bool{}
	visible := func(m *schema.Message) bool { return !hidden(m, summaries, markers) }
	for i := range msgs {
		if m := &msgs[i]; visible(m) && st.IsPinned(m) {
			keep[m.ID] = true
		}
	}
	if p == nil || p.KeepsTask() {
		for i := range msgs {
			if m := &msgs[i]; agentUser(m) {
				if visible(m) {
					keep[m.ID] = true
				}
				break
			}
		}
		for i := len(msgs) - 1; i >= 0; i-- {
			if m := &msgs[i]; agentUser(m) && strings.TrimSpace(userText(m.Content)) != "" {
				if visible(m) {
					keep[m.ID] = true
				}
				break
			}
		}
	}
	if len(keep) == 0 {
		return nil
	}
	closeExchanges(msgs, keep, visible)
	closeSummaryPairs(msgs, keep, visible)
	return keep
}

// closeSummaryPairs keeps a summary and its acknowledgement together: a
// pinned acknowledgement without its summary would open the effective
// history with an assistant message, a pinned summary without its
// acknowledgement would meet the next user message.
func closeSummaryPairs(msgs []schema.Message, keep map[string]bool, visible func(*schema.Message) bool) {
	kept := map[string]bool{} // condense ids of kept summaries and acknowledgements
	for i := range msgs {
		if m := &msgs[i]; keep[m.ID] && m.IsSummary && !m.IsMask() && m.CondenseID != "" {
			kept[m.CondenseID] = true
		}
	}
	if len(kept) == 0 {
		return
	}
	for i := range msgs {
		if m := &msgs[i]; m.IsSummary && !m.IsMask() && kept[m.CondenseID] && visible(m) {
			keep[m.ID] = true
		}
	}
}

// agentUser reports whether m is a user turn the agent sent (or a masked
// stand-in for one).
func agentUser(m *schema.Message) bool {
	return m.Role == schema.RoleUser && (!m.Synthetic() || m.IsMask())
}

// userText joins a content's text blocks (tool results left out).
func userText(c schema.Content) string { return c.OwnText("\n") }

// closeExchanges adds to keep the visible messages that hold the calls a
// kept message's results answer, and the results of a kept message's
// calls, until nothing changes.
func closeExchanges(msgs []schema.Message, keep map[string]bool, visible func(*schema.Message) bool) {
	for changed := true; changed; {
		changed = false
		calls, results := map[string]bool{}, map[string]bool{}
		for i := range msgs {
			if !keep[msgs[i].ID] {
				continue
			}
			for _, b := range msgs[i].Content.Blocks {
				switch b.Type {
				case schema.BlockToolUse:
					calls[b.ID] = true
				case schema.BlockToolResult:
					results[b.ToolUseID] = true
				}
			}
		}
		for i := range msgs {
			m := &msgs[i]
			if keep[m.ID] || !visible(m) {
				continue
			}
			for _, b := range m.Content.Blocks {
				if (b.Type == schema.BlockToolUse && results[b.ID]) || (b.Type == schema.BlockToolResult && calls[b.ToolUseID]) {
					keep[m.ID] = true
					changed = true
					break
				}
			}
		}
	}
}

// keptTokens is the context that the kept messages alone make, with the
// system prompt: no reduction can go below it.
func keptTokens(systemTokens int, msgs []schema.Message, keep map[string]bool) int {
	n := systemTokens
	walkEffective(msgs, func(m *schema.Message, _ map[string]bool) {
		if keep[m.ID] {
			n += m.Tokens
		}
	})
	return n
}

// pin records a pin input's verdict on a stored message in the state. It
// changes no message: the store keeps bodies as sent, and the state is what
// every reduction reads. Pinning a message that is hidden already does not
// bring it back (a rewind does); it keeps the message from the reductions
// to come once it is visible.
func (r *run) pin() error {
	msgs, err := r.h.Messages(r.ctx)
	if err != nil {
		return fmt.Errorf("load history of %s: %w", r.in.ConversationID, err)
	}
	var target *schema.Message
	for i := range msgs {
		if msgs[i].ID == r.in.MessageID {
			target = &msgs[i]
			break
		}
	}
	if target == nil {
		return schema.Errorf(schema.ReasonUnknownTarget, "no stored message %q", r.in.MessageID)
	}
	id := target.ID
	if target.IsMask() {
		id = target.MaskOf // a stand-in follows its original
	}
	pins := make(map[string]bool, len(r.st.Pins)+1) // never write into the caller's map
	for k, v := range r.st.Pins {
		pins[k] = v
	}
	pins[id] = r.in.Pinned
	for i := range msgs {
		if msgs[i].ID == id && msgs[i].Pinned == r.in.Pinned {
			delete(pins, id) // the stored flag says it already
		}
	}
	if len(pins) > schema.MaxPins {
		return schema.Errorf(schema.ReasonTooLarge, "more than %d pin changes in one conversation", schema.MaxPins)
	}
	r.st.Pins = pins
	if len(pins) == 0 {
		r.st.Pins = nil
	}
	return nil
}
