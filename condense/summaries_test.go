package condense

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/ctxpipe/ctxpipe/internal/openaitest"
	"github.com/ctxpipe/ctxpipe/prompts"
	"github.com/ctxpipe/ctxpipe/schema"
)

func callMsg(blocks ...schema.Block) schema.Message {
	return schema.Message{Turn: schema.Turn{Role: schema.RoleAssistant, Content: schema.BlockContent(blocks...)}}
}

func use(id, name, input string) schema.Block {
	return schema.Block{Type: schema.BlockToolUse, ID: id, Name: name, Input: json.RawMessage(input)}
}

func resultMsg(id, out string) schema.Message {
	c := schema.TextContent(out)
	return schema.Message{Turn: schema.Turn{Role: schema.RoleUser, Content: schema.BlockContent(
		schema.Block{Type: schema.BlockToolResult, ToolUseID: id, Content: &c})}}
}

// Both summarizers end with the mechanical list of files, whatever the
// model wrote, and the offline one with the span's last error line.
func TestSummariesCarryFilesAndLastError(t *testing.T) {
	msgs := []schema.Message{
		textMsg(schema.RoleUser, "Fix the parser"),
		callMsg(use("1", "bash", `{"command":"python -m pytest tests/test_parser.py"}`)),
		resultMsg("1", "collected 3 items\nE   ValueError: bad token at 3\nFAILED tests/test_parser.py::test_x - ValueError: bad token at 3\n1 failed"),
		callMsg(use("2", "edit_file", `{"path":"src/parser.py"}`)),
		resultMsg("2", "ok"),
		textMsg(schema.RoleUser, prompts.FinalInstruction),
	}
	srv := openaitest.New(t)
	srv.Enqueue(openaitest.Reply{Text: "The model forgot every path.", PromptTokens: 10, CompletionTokens: 5})
	o, _ := newTestOpenAI(Config{BaseURL: srv.URL(), Model: "m"})
	req := schema.SummaryRequest{Prompt: prompts.Detailed, Messages: msgs}
	for _, s := range []struct {
		name string
		sum  interface {
			Summarize(context.Context, schema.SummaryRequest) (schema.Summary, error)
		}
		lastError bool
	}{{"openai", o, false}, {"offline", &Offline{}, true}} {
		t.Run(s.name, func(t *testing.T) {
			sum, err := s.sum.Summarize(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{"- tests/test_parser.py (read)", "- src/parser.py (edited)"} {
				if !strings.Contains(sum.Text, want) {
					t.Errorf("no %q in:\n%s", want, sum.Text)
				}
			}
			if got := strings.Contains(sum.Text, ": FAILED tests/test_parser.py::test_x - ValueError: bad token at 3"); got != s.lastError {
				t.Errorf("last error quoted = %v, want %v:\n%s", got, s.lastError, sum.Text)
			}
		})
	}
}
