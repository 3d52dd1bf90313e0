package condense

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ctxpipe/ctxpipe/prompts"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/textfacts"
)

// transcriptDir is reached by a relative path so the tests run the same in
// the work tree and in CI, where shared/ sits beside the repository.
const transcriptDir = "../../shared/data/transcripts"

func loadTranscript(t *testing.T, name string) []schema.Message {
	t.Helper()
	f, err := os.Open(filepath.Join(transcriptDir, name+".jsonl"))
	if err != nil {
		t.Fatalf("open transcript: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	var msgs []schema.Message
	for sc.Scan() {
		var turn schema.Turn
		if err := json.Unmarshal(sc.Bytes(), &turn); err != nil {
			t.Fatalf("%s line %d: %v", name, len(msgs)+1, err)
		}
		msgs = append(msgs, schema.Message{Turn: turn})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return msgs
}

// inputChars is the size of what the summary replaces, as the model would see it.
func inputChars(msgs []schema.Message) int {
	n := 0
	for _, m := range msgs {
		n += utf8.RuneCountInString(RenderContent(m.Content))
	}
	return n
}

// section returns the text under "## <heading>" up to the next heading.
func section(text, heading string) string {
	_, rest, ok := strings.Cut(text, "## "+heading+"\n")
	if !ok {
		return ""
	}
	if i := strings.Index(rest, "\n## "); i >= 0 {
		rest = rest[:i]
	}
	return rest
}

var bullet = regexp.MustCompile("(?m)^- `?([^`\n]+?)`?$")

func TestOfflineOnTranscripts(t *testing.T) {
	tests := []string{
		"msa_deepseek-chat_astropy__astropy-12907",
		"msa_deepseek-reasoner_sqlfluff__sqlfluff-1625",
		"sweagent_demo_marshmallow-code__marshmallow-1867",
	}
	for _, name := range tests {
		t.Run(name, func(t *testing.T) {
			msgs := loadTranscript(t, name)
			req := schema.SummaryRequest{ConversationID: name, Prompt: prompts.Detailed,
				Messages: append(append([]schema.Message(nil), msgs...), textMsg(schema.RoleUser, prompts.FinalInstruction))}
			sum, err := (&Offline{}).Summarize(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			text := sum.Text
			if sum.Model != OfflineModel || sum.Cost != 0 {
				t.Errorf("model %q cost %v", sum.Model, sum.Cost)
			}

			// The six headings, in the Detailed prompt's order.
			last := -1
			for _, h := range prompts.DetailedSections {
				i := strings.Index(text, "## "+h+"\n")
				if i <= last {
					t.Fatalf("heading %q missing or out of order in:\n%s", h, text)
				}
				last = i
			}

			// Bounded, and much shorter than the conversation.
			n, in := utf8.RuneCountInString(text), inputChars(msgs)
			if n > DefaultOfflineMaxChars || n*10 > in {
				t.Errorf("summary has %d chars for %d input chars", n, in)
			}

			// Every listed file really occurs in a tool input, and at least one is listed.
			var inputs strings.Builder
			for _, m := range msgs {
				for _, b := range m.Content.BlocksOf() {
					if b.Type == schema.BlockToolUse {
						inputs.Write(b.Input)
						inputs.WriteByte('\n')
					}
				}
			}
			files := bullet.FindAllStringSubmatch(section(text, prompts.DetailedSections[3]), -1)
			listed := 0
			for _, f := range files {
				if strings.HasPrefix(f[1], "… and ") {
					continue
				}
				listed++
				if !strings.Contains(inputs.String(), f[1]) {
					t.Errorf("listed file %q is not in any tool input", f[1])
				}
			}
			if listed == 0 {
				t.Errorf("no file listed:\n%s", text)
			}

			// The last command run is quoted from the transcript.
			var lastInput map[string]any
			var lastCall schema.Block
			for _, m := range msgs {
				for _, b := range m.Content.BlocksOf() {
					if b.Type == schema.BlockToolUse {
						lastInput, lastCall = nil, b
						_ = json.Unmarshal(b.Input, &lastInput)
					}
				}
			}
			if cmd, ok := lastInput["command"].(string); ok && strings.TrimSpace(cmd) != "" {
				if want, _ := textfacts.CallLine(lastCall, textfacts.ReadToolInput(lastCall.Input)); !strings.Contains(section(text, prompts.DetailedSections[4]), "`"+want+"`") {
					t.Errorf("last command %q not in section 5:\n%s", want, text)
				}
			}

			// The task is quoted from the first user message.
			firstLine, _, _ := strings.Cut(strings.TrimSpace(userText(msgs[0].Content)), "\n")
			prefix := []rune(strings.TrimSpace(firstLine))
			prefix = prefix[:min(60, len(prefix))]
			if !strings.Contains(section(text, prompts.DetailedSections[0]), "> "+string(prefix)) {
				t.Errorf("task not quoted; first line %q", firstLine)
			}
			if strings.Contains(text, prompts.FinalInstruction) {
				t.Error("the final instruction was summarized")
			}

			// Deterministic, and blind to the final instruction turn.
			again, _ := (&Offline{}).Summarize(context.Background(), schema.SummaryRequest{Messages: msgs})
			if again.Text != text {
				t.Errorf("not deterministic (or the final instruction changed the output)")
			}
		})
	}
}

func TestOfflineSynthetic(t *testing.T) {
	errText := schema.TextContent("<returncode>1</returncode>\n<output>\nTraceback (most recent call last):\n  File \"x.py\", line 3\nZeroDivisionError: division by zero\n</output>")
	okText := schema.TextContent("fine")
	earlier := "Offline extractive summary of 9 messages.\n\n## 4. Relevant files and code\n- old/kept.go\n- … and 3 more\n\n## 5. Problem solving\nNone."
	msgs := []schema.Message{
		textMsg(schema.RoleUser, "Make the parser handle empty input."),
		{Turn: schema.Turn{Role: schema.RoleAssistant, Content: schema.BlockContent(
			schema.Block{Type: schema.BlockReasoning, Text: "hidden"},
			schema.Block{Type: schema.BlockText, Text: "Reading the earlier summary."},
		)}, IsSummary: true},
		{Turn: schema.Turn{Role: schema.RoleAssistant, Content: schema.BlockContent(schema.Block{Type: schema.BlockText, Text: earlier})}, IsSummary: true},
		{Turn: schema.Turn{Role: schema.RoleAssistant, Content: schema.BlockContent(
			schema.Block{Type: schema.BlockText, Text: "I will open the parser first and then run the tests."},
			schema.Block{Type: schema.BlockToolUse, ID: "c1", Name: "read_file", Input: json.RawMessage(`{"path":"src/parser.go"}`)},
			schema.Block{Type: schema.BlockToolUse, ID: "c0", Name: "find_file", Input: json.RawMessage(`{"file_name":"lexer.go","dir":"internal"}`)},
			schema.Block{Type: schema.BlockToolUse, ID: "c2", Name: "bash", Input: json.RawMessage(`{"command":"cd /repo && python -m pytest tests/test_parse.py -q 2>&1 | tail -5"}`)},
		)}},
		{Turn: schema.Turn{Role: schema.RoleUser, Content: schema.BlockContent(
			schema.Block{Type: schema.BlockToolResult, ToolUseID: "c1", Content: &okText},
			schema.Block{Type: schema.BlockToolResult, ToolUseID: "c2", IsError: true, Content: &errText},
		)}},
		textMsg(schema.RoleUser, "Also keep the old behaviour for whitespace-only input, please."),
		textMsg(schema.RoleUser, prompts.SnapshotFinalInstruction),
	}
	sum, err := (&Offline{}).Summarize(context.Background(), schema.SummaryRequest{Messages: msgs})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"of 6 messages (3 tool calls, 1 failed)",
		"> Make the parser handle empty input.",
		"Earlier summary (start):",
		"- src/parser.go", "- lexer.go", "- internal\n", "- /repo", "- tests/test_parse.py", "- old/kept.go",
		"Tools used: bash (1), find_file (1), read_file (1)",
		"File types: .go (3), .py (1)",
		"- `read_file {\"path\":\"src/parser.go\"}`",
		"Last command: `cd /repo && python -m pytest tests/test_parse.py -q 2>&1 | tail -5`",
		"c2 (`cd /repo && python -m pytest tests/test_parse.py …`): exit 1: ZeroDivisionError: division by zero",
		"- I will open the parser first and then run the tests.",
		"Latest user request (verbatim):\n> Also keep the old behaviour for whitespace-only input, please.",
	} {
		if !strings.Contains(sum.Text, want) {
			t.Errorf("summary lacks %q:\n%s", want, sum.Text)
		}
	}
	if strings.Contains(sum.Text, "hidden") || strings.Contains(sum.Text, "Reading the earlier summary") && !strings.Contains(sum.Text, "Earlier summary") {
		t.Errorf("reasoning leaked:\n%s", sum.Text)
	}
}

func TestOfflineBounded(t *testing.T) {
	long := strings.Repeat("word ", 5000)
	var msgs []schema.Message
	msgs = append(msgs, textMsg(schema.RoleUser, "first task "+long))
	for i := range 300 {
		in := fmt.Sprintf(`{"command":"grep -rn thing%d pkg%d/file%d.go && cat dir/sub%d/notes%d.md"}`, i, i, i, i, i)
		res := schema.TextContent(fmt.Sprintf("failure %d %s", i, long))
		msgs = append(msgs,
			schema.Message{Turn: schema.Turn{Role: schema.RoleAssistant, Content: schema.BlockContent(
				schema.Block{Type: schema.BlockText, Text: fmt.Sprintf("Step %d. %s", i, long)},
				schema.Block{Type: schema.BlockToolUse, ID: fmt.Sprint("c", i), Name: "bash", Input: json.RawMessage(in)},
			)}},
			schema.Message{Turn: schema.Turn{Role: schema.RoleUser, Content: schema.BlockContent(
				schema.Block{Type: schema.BlockToolResult, ToolUseID: fmt.Sprint("c", i), IsError: true, Content: &res},
			)}},
		)
	}
	msgs = append(msgs, textMsg(schema.RoleUser, "the latest request "+long))
	for _, limit := range []int{0, 1500} {
		sum, err := (&Offline{MaxChars: limit}).Summarize(context.Background(), schema.SummaryRequest{Messages: msgs})
		if err != nil {
			t.Fatal(err)
		}
		want := limit
		if want == 0 {
			want = DefaultOfflineMaxChars
		}
		// The last error line and the files touched come on top, each bounded.
		if n := utf8.RuneCountInString(sum.Text); n > want+textfacts.MaxFileListChars+lastErrorsShown*(textfacts.MaxErrorLineChars+100)+200 {
			t.Errorf("limit %d: %d chars", limit, n)
		}
		if !strings.Contains(sum.Text, "## "+prompts.DetailedSections[5]+"\nLatest user request (verbatim):\n> the latest request word") {
			t.Errorf("limit %d: the latest request was cut:\n%s", limit, sum.Text)
		}
		if limit == 0 && !strings.Contains(sum.Text, "earlier not shown") {
			t.Errorf("limit %d: lists not capped", limit)
		}
	}
}

func TestOfflineEmpty(t *testing.T) {
	sum, err := (&Offline{}).Summarize(context.Background(), schema.SummaryRequest{})
	if err != nil || sum.Text == "" {
		t.Fatalf("sum %q err %v", sum.Text, err)
	}
	for _, h := range prompts.DetailedSections {
		if !strings.Contains(sum.Text, "## "+h) {
			t.Errorf("missing %q", h)
		}
	}
}
