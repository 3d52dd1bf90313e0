package condense

import (
	"strings"

	"github.com/ctxpipe/ctxpipe/schema"
)

// RenderContent turns a message's content into plain text for a chat model:
// text blocks as they are, reasoning left out (it is the model's private
// scratch work and often large), a tool call as one line naming the tool and
// its id followed by its raw JSON input, a tool result as a line naming the
// call it answers (marked [error] when it failed) followed by its text, and
// any image left as "[image]". Parts are separated by blank lines.
func RenderContent(c schema.Content) string {
	if !c.IsBlocks {
		return c.Text
	}
	parts := make([]string, 0, len(c.Blocks))
	for _, b := range c.Blocks {
		if s, ok := renderBlock(b); ok {
			parts = append(parts, s)
		}
	}
	return strings.Join(parts, "\n\n")
}

func renderBlock(b schema.Block) (string, bool) {
	switch b.Type {
	case schema.BlockText:
		return b.Text, b.Text != ""
	case schema.BlockReasoning:
		return "", false
	case schema.BlockImage:
		return "[image]", true
	case schema.BlockToolUse:
		input := strings.TrimSpace(string(b.Input))
		if input == "" {
			input = "{}"
		}
		return "[tool call " + b.Name + ", id " + b.ID + "] " + input, true
	case schema.BlockToolResult:
		head := "[tool result for " + b.ToolUseID + "]"
		if b.IsError {
			head += " [error]"
		}
		body := ""
		if b.Content != nil {
			body = RenderContent(*b.Content)
		}
		if body == "" {
			return head, true
		}
		return head + "\n" + body, true
	}
	// An unknown block type cannot reach here through validated input; say
	// so rather than drop it silently.
	return "[" + string(b.Type) + "]", true
}
