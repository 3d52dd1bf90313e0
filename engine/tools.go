package engine

import (
	"iter"

	"github.com/ctxpipe/ctxpipe/schema"
)

// Tool calls and their results. An assistant turn opens calls; the user
// turns after it answer them, all in one turn (Anthropic) or one turn per
// call (OpenAI's tool messages). Every reduction keeps a call visible while
// a visible result answers it or its result has yet to arrive, so no result
// the agent sends is ever dropped as an orphan.

// openToolUses returns the calls of the last agent assistant turn that no
// later message answers: the calls whose results are still to come.
func openToolUses(msgs []schema.Message) map[string]bool {
	answered := map[string]bool{}
	for i := len(msgs) - 1; i >= 0; i-- {
		m := &msgs[i]
		if m.Synthetic() {
			continue
		}
		if m.Role != schema.RoleAssistant {
			for _, b := range m.Content.Blocks {
				if b.Type == schema.BlockToolResult {
					answered[b.ToolUseID] = true
				}
			}
			continue
		}
		var open map[string]bool
		for _, b := range m.Content.Blocks {
			if b.Type == schema.BlockToolUse && !answered[b.ID] {
				if open == nil {
					open = map[string]bool{}
				}
				open[b.ID] = true
			}
		}
		return open
	}
	return nil
}

// blocksOf yields the content blocks of msgs, message by message, in order.
func blocksOf(msgs []schema.Message) iter.Seq[schema.Block] {
	return func(yield func(schema.Block) bool) {
		for i := range msgs {
			for _, b := range msgs[i].Content.Blocks {
				if !yield(b) {
					return
				}
			}
		}
	}
}
