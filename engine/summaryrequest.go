package engine

import (
	"regexp"
	"strings"

	"github.com/ctxpipe/ctxpipe/prompts"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/tokens"
)

// visibleOf keeps the messages of sub that are in the effective history of
// all (as the effective history has them: orphaned tool results dropped).
func visibleOf(sub, all []schema.Message) []schema.Message {
	want := make(map[string]bool, len(sub))
	for i := range sub {
		want[sub[i].ID] = true
	}
	var out []schema.Message
	for _, m := range EffectiveHistory(all) {
		if want[m.ID] {
			out = append(out, m)
		}
	}
	return out
}

// stripImages replaces image blocks (also inside tool results) with a short
// text: a summary needs no pixels, and images are the costliest input.
func stripImages(msgs []schema.Message) []schema.Message {
	noImage := func(b schema.Block) schema.Block {
		if b.Type == schema.BlockImage {
			return schema.Block{Type: schema.BlockText, Text: "[image omitted]"}
		}
		return b
	}
	return mapBlocks(msgs, func(b schema.Block) schema.Block {
		if b.Type == schema.BlockToolResult && b.Content != nil && b.Content.IsBlocks {
			nested := make([]schema.Block, len(b.Content.Blocks))
			for i, nb := range b.Content.Blocks {
				nested[i] = noImage(nb)
			}
			c := schema.BlockContent(nested...)
			b.Content = &c
		}
		return noImage(b)
	})
}

// mapBlocks returns copies of msgs with f applied to every block of
// array-form content; the stored messages are left as they are.
func mapBlocks(msgs []schema.Message, f func(schema.Block) schema.Block) []schema.Message {
	out := make([]schema.Message, len(msgs))
	for i, m := range msgs {
		out[i] = m
		if !m.Content.IsBlocks {
			continue
		}
		blocks := make([]schema.Block, len(m.Content.Blocks))
		for j, b := range m.Content.Blocks {
			blocks[j] = f(b)
		}
		out[i].Content = schema.BlockContent(blocks...)
	}
	return out
}

// withDeferredToolResults answers every tool call that has no result yet
// with a synthetic one, so the summarizer's request is a valid tool exchange.
func withDeferredToolResults(msgs []schema.Message) []schema.Message {
	answered := map[string]bool{}
	for b := range blocksOf(msgs) {
		if b.Type == schema.BlockToolResult {
			answered[b.ToolUseID] = true
		}
	}
	var pending []schema.Block
	for b := range blocksOf(msgs) {
		if b.Type == schema.BlockToolUse && !answered[b.ID] {
			c := schema.TextContent(prompts.ToolDeferred)
			pending = append(pending, schema.Block{Type: schema.BlockToolResult, ToolUseID: b.ID, Content: &c})
		}
	}
	if len(pending) == 0 {
		return msgs
	}
	out := append([]schema.Message(nil), msgs...)
	return append(out, schema.Message{Turn: schema.Turn{Role: schema.RoleUser, Content: schema.BlockContent(pending...)}})
}

// withTailResults appends, after a summarized span, the results that the
// kept tail holds for the span's calls, so the summarizer sees what each
// call it reads returned. Only the result turns right after the cut count:
// the tail's first assistant turn starts exchanges of its own.
func withTailResults(span, tail []schema.Message) []schema.Message {
	calls := map[string]bool{}
	for b := range blocksOf(span) {
		switch b.Type {
		case schema.BlockToolUse:
			calls[b.ID] = true
		case schema.BlockToolResult:
			delete(calls, b.ToolUseID)
		}
	}
	var results []schema.Block
	for i := 0; i < len(tail) && len(calls) > 0 && tail[i].Role != schema.RoleAssistant; i++ {
		for _, b := range tail[i].Content.Blocks {
			if b.Type == schema.BlockToolResult && calls[b.ToolUseID] {
				results = append(results, b)
				delete(calls, b.ToolUseID)
			}
		}
	}
	if len(results) == 0 {
		return span
	}
	return append(span[:len(span):len(span)], schema.Message{Turn: schema.Turn{Role: schema.RoleUser, Content: schema.BlockContent(results...)}})
}

// toolBlocksAsText turns tool calls and results into text blocks, so the
// summarizer request needs no tool definitions (providers reject tool blocks
// without them).
func toolBlocksAsText(msgs []schema.Message) []schema.Message {
	return mapBlocks(msgs, func(b schema.Block) schema.Block {
		switch b.Type {
		case schema.BlockToolUse:
			return schema.Block{Type: schema.BlockText, Text: tokens.SerializeToolUse(&b)}
		case schema.BlockToolResult:
			return schema.Block{Type: schema.BlockText, Text: tokens.SerializeToolResult(&b)}
		}
		return b
	})
}

// commandPattern matches a <command> element, bare or with attributes
// (<command name="deploy">), across lines. The name must end at the tag
// name's end, so <commands> or <commander> do not match.
var commandPattern = regexp.MustCompile(`(?s)<command(?:\s[^>]*)?>.*?</command>`)

// commandBlocks returns the <command> blocks of a message's text, which a
// summary carries so that slash-command instructions survive every condense.
// The text blocks are joined first: an agent may split one element across
// two blocks.
func commandBlocks(m schema.Message) string {
	var text []string
	for _, b := range m.Content.BlocksOf() {
		if b.Type == schema.BlockText {
			text = append(text, b.Text)
		}
	}
	return strings.Join(commandPattern.FindAllString(strings.Join(text, "\n"), -1), "\n")
}
