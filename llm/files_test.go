package llm

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
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

func TestFilesTouched(t *testing.T) {
	tests := []struct {
		name string
		msgs []schema.Message
		want []FileTouch
	}{
		{"path keys, strongest action wins", []schema.Message{
			callMsg(use("1", "read_file", `{"path":"src/a.go"}`), use("2", "Read", `{"file_path":"/repo/b.py"}`)),
			callMsg(use("3", "str_replace_editor", `{"command":"str_replace","path":"src/a.go"}`)),
			callMsg(use("4", "write_to_file", `{"path":"docs/new.md","content":"x"}`)),
		}, []FileTouch{{"src/a.go", "edited"}, {"/repo/b.py", "read"}, {"docs/new.md", "created"}}},
		{"shell commands", []schema.Message{
			callMsg(use("1", "bash", `{"command":"cat ./astropy/io/qdp.py | head"}`)),
			callMsg(use("2", "bash", `{"command":"sed -i 's/a/b/' pkg/mod.go"}`)),
			callMsg(use("3", "bash", `{"command":"cat <<'EOF' > /testbed/repro.py\nimport not/a/path.py\nEOF"}`)),
			callMsg(use("4", "bash", `{"command":"python /testbed/repro.py 2>&1 | tee out.log"}`)),
		}, []FileTouch{{"astropy/io/qdp.py", "read"}, {"pkg/mod.go", "edited"}, {"/testbed/repro.py", "created"}, {"out.log", "created"}}},
		{"carried from an earlier summary, final turn ignored", []schema.Message{
			{Turn: schema.Turn{Role: schema.RoleUser, Content: schema.TextContent("earlier\n\n" + FilesTouchedHeading + "\n- old/x.go (edited)\n- old/y.go (read)")}, IsSummary: true, CondenseID: "c"},
			callMsg(use("1", "view", `{"path":"old/y.go"}`)),
			{Turn: schema.Turn{Role: schema.RoleUser, Content: schema.TextContent(prompts.FinalInstruction)}},
		}, []FileTouch{{"old/x.go", "edited"}, {"old/y.go", "read"}}},
		{"none", []schema.Message{textMsg(schema.RoleUser, "hello src/z.go")}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := FilesTouched(tt.msgs); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("FilesTouched = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestRenderFilesTouchedBounded(t *testing.T) {
	var files []FileTouch
	for i := range MaxFilesTouched {
		files = append(files, FileTouch{fmt.Sprintf("some/rather/long/directory/name/file%03d.go", i), "read"})
	}
	s := RenderFilesTouched(files)
	if len(s) > maxFilesTouchedChars+40 || !strings.Contains(s, "more") || !strings.HasPrefix(s, FilesTouchedHeading) {
		t.Errorf("%d chars:\n%s", len(s), s)
	}
	if RenderFilesTouched(nil) != "" {
		t.Error("an empty list renders a heading")
	}
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

func TestLastErrorLine(t *testing.T) {
	tests := []struct{ out, want string }{
		{"ok\nall good", ""},
		{"Traceback (most recent call last):\n  File \"x.py\", line 3\n    raise ValueError(x)\nValueError: boom\n", "ValueError: boom"},
		{"12:    except KeyError:\n13:        pass", ""},
		{"[ctxpipe masked this tool result: bash command=\"make\"; 90 tokens, 4 lines hidden; last error: make: *** [all] Error 2. Run the call again to see it.]", "make: *** [all] Error 2"},
	}
	for _, tt := range tests {
		if got := LastErrorLine(tt.out); got != tt.want {
			t.Errorf("LastErrorLine(%q) = %q, want %q", tt.out, got, tt.want)
		}
	}
}

// A manual condense's instructions reach the model in its system prompt.
func TestInstructionsReachTheModel(t *testing.T) {
	srv := openaitest.New(t)
	o, _ := newTestOpenAI(Config{BaseURL: srv.URL(), Model: "m"})
	for _, in := range []string{"", "keep the failing test names"} {
		req := simpleRequest(schema.Profile{})
		req.Instructions = in
		if _, err := o.Summarize(context.Background(), req); err != nil {
			t.Fatal(err)
		}
		reqs := srv.Requests()
		sys := reqs[len(reqs)-1].Chat.Messages[0]
		if sys.Role != "system" || !strings.HasPrefix(sys.Content, prompts.Detailed) {
			t.Fatalf("system message %+v", sys)
		}
		if got := strings.Contains(sys.Content, prompts.RequestInstructions+"\n<instructions>\nkeep the failing test names\n</instructions>"); got != (in != "") {
			t.Errorf("instructions %q in the system prompt: %v\n%s", in, got, sys.Content)
		}
	}
}
