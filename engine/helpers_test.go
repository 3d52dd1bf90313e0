package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/tokens"
)

const testConv = "conv-1"

// msgID gives message i a stable UUID so tests can name it.
func msgID(i int) string { return fmt.Sprintf("00000000-0000-4000-8000-%012d", i) }

// textMsg is message i: even indices are user turns, odd ones assistant turns.
func textMsg(i int, text string) schema.Message {
	role := schema.RoleUser
	if i%2 == 1 {
		role = schema.RoleAssistant
	}
	return schema.Message{Turn: schema.Turn{
		ID: msgID(i), ConversationID: testConv, TS: int64(1000 + 10*i), Role: role,
		Content: schema.TextContent(text),
	}, Tokens: len(text)}
}

func msgs(n int) []schema.Message {
	out := make([]schema.Message, n)
	for i := range out {
		out[i] = textMsg(i, fmt.Sprintf("message %d", i))
	}
	return out
}

func ids(ms []schema.Message) []string {
	out := make([]string, len(ms))
	for i := range ms {
		switch {
		case ms[i].IsMask(): // a masked stand-in, named after its original
			out[i] = fmt.Sprintf("M%d", (ms[i].TS-1000)/10)
		case ms[i].IsSummary:
			out[i] = "S"
		case ms[i].IsTruncationMarker:
			out[i] = "T"
		default:
			out[i] = fmt.Sprintf("m%d", (ms[i].TS-1000)/10)
		}
	}
	return out
}

func join(ms []schema.Message) string { return strings.Join(ids(ms), " ") }

// lenCount counts a content as its text length, so figures are easy to reason about.
func lenCount(c schema.Content) int {
	n := 0
	for _, b := range c.BlocksOf() {
		n += len(b.Text)
	}
	return n
}

func toolUse(id, name, input string) schema.Block {
	return schema.Block{Type: schema.BlockToolUse, ID: id, Name: name, Input: json.RawMessage(input)}
}

func toolResult(id, text string) schema.Block {
	c := schema.TextContent(text)
	return schema.Block{Type: schema.BlockToolResult, ToolUseID: id, Content: &c}
}

// fixedSummarizer answers every request with text and records the requests.
type fixedSummarizer struct {
	text     string
	err      error
	requests []schema.SummaryRequest
}

func (f *fixedSummarizer) Summarize(_ context.Context, req schema.SummaryRequest) (schema.Summary, error) {
	f.requests = append(f.requests, req)
	if f.err != nil {
		return schema.Summary{}, f.err
	}
	return schema.Summary{Text: f.text, Model: "test-model", InputTokens: 100, OutputTokens: 10, Cost: 0.5}, nil
}

func intp(v int) *int    { return &v }
func boolp(v bool) *bool { return &v }

// charEngine counts with the character heuristic and no fudge, so tests can
// build conversations of a known size quickly.
func charEngine(s Summarizer) *Engine {
	e := NewEngine(s)
	e.Log = slog.New(slog.DiscardHandler)
	e.Counter = func(p *schema.Profile) (tokens.Counter, error) {
		return tokens.Counter{Text: tokens.Chars{}, Fudge: 1}, nil
	}
	return e
}

func mustNoErr(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
