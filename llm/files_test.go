package llm

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
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

func ft(path, how string) FileTouch { return FileTouch{Path: path, How: how} }

func group(dir, how string, n int) FileTouch { return FileTouch{Path: dir, How: how, Files: n} }

func marker(text string) schema.Message {
	return schema.Message{Turn: schema.Turn{Role: schema.RoleUser, Content: schema.TextContent(text)}, IsTruncationMarker: true, TruncationID: "t"}
}

func TestFilesTouched(t *testing.T) {
	var many []schema.Message
	var manyWant []FileTouch
	for i := range 400 {
		p := fmt.Sprintf("pkg%d/file%03d.go", i%7, i)
		many = append(many, callMsg(use(fmt.Sprint(i), "bash", `{"command":"cat `+p+`"}`)))
		manyWant = append(manyWant, ft(p, "read"))
	}
	tests := []struct {
		name string
		msgs []schema.Message
		want []FileTouch
	}{
		{"path keys, strongest action wins", []schema.Message{
			callMsg(use("1", "read_file", `{"path":"src/a.go"}`), use("2", "Read", `{"file_path":"/repo/b.py"}`)),
			callMsg(use("3", "str_replace_editor", `{"command":"str_replace","path":"src/a.go"}`)),
			callMsg(use("4", "write_to_file", `{"path":"docs/new.md","content":"x"}`)),
		}, []FileTouch{ft("src/a.go", "edited"), ft("/repo/b.py", "read"), ft("docs/new.md", "created")}},
		{"shell commands", []schema.Message{
			callMsg(use("1", "bash", `{"command":"cat ./astropy/io/qdp.py | head"}`)),
			callMsg(use("2", "bash", `{"command":"sed -i 's/a/b/' pkg/mod.go"}`)),
			callMsg(use("3", "bash", `{"command":"cat <<'EOF' > /testbed/repro.py\nimport not/a/path.py\nEOF"}`)),
			callMsg(use("4", "bash", `{"command":"python /testbed/repro.py 2>&1 | tee out.log"}`)),
		}, []FileTouch{ft("astropy/io/qdp.py", "read"), ft("pkg/mod.go", "edited"), ft("/testbed/repro.py", "created"), ft("out.log", "created")}},
		{"commands after a here document's closing line", []schema.Message{
			callMsg(use("1", "bash", `{"command":"cat > fix.py << 'EOF'\nopen('in/body.py')\nEOF\npython fix.py && mv src/a.py.new src/a.py\necho done > log/out.txt"}`)),
		}, []FileTouch{ft("fix.py", "created"), ft("src/a.py.new", "read"), ft("src/a.py", "read"), ft("log/out.txt", "created")}},
		{"two here documents, an indented close, a here-string", []schema.Message{
			callMsg(use("1", "bash", `{"command":"cat <<A > one.md; cat <<-\"B\" > two.md\nbody/x.py\nA\nbody/y.py\n\tB\ngrep x <<< \"s\" src/c.go\ncat src/d.go"}`)),
		}, []FileTouch{ft("one.md", "created"), ft("two.md", "created"), ft("src/c.go", "read"), ft("src/d.go", "read")}},
		{"a here document that never closes hides the rest", []schema.Message{
			callMsg(use("1", "bash", `{"command":"cat > a.md <<EOF\nb/c.py\nEOF \ncat d/e.py"}`)),
		}, []FileTouch{ft("a.md", "created")}},
		{"carried from an earlier summary, final turn ignored", []schema.Message{
			{Turn: schema.Turn{Role: schema.RoleUser, Content: schema.TextContent("earlier\n\n" + FilesTouchedHeading + "\n- old/x.go (edited)\n- old/y.go (read)")}, IsSummary: true, CondenseID: "c"},
			callMsg(use("1", "view", `{"path":"old/y.go"}`)),
			{Turn: schema.Turn{Role: schema.RoleUser, Content: schema.TextContent(prompts.FinalInstruction)}},
		}, []FileTouch{ft("old/x.go", "edited"), ft("old/y.go", "read")}},
		{"the last section of a summary that quotes an earlier one", []schema.Message{
			{Turn: schema.Turn{Role: schema.RoleUser, Content: schema.TextContent("> " + FilesTouchedHeading + "\n> - quoted/q.go (read)\n## Next\n\n" + FilesTouchedHeading + "\n- real/r.go (edited)")}, IsSummary: true, CondenseID: "c"},
		}, []FileTouch{ft("real/r.go", "edited")}},
		{"carried from a truncation marker, braces and groups", []schema.Message{
			marker("[Sliding window truncation: 9 messages hidden to reduce context]\n" + MarkerFilesHeading +
				" a/b.go (edited), c/{d.py,e.py} (read), tests/** (read; 40 files), ./** (created; 1 file)\nAn error in the hidden messages: x"),
			callMsg(use("1", "bash", `{"command":"touch tests/new.py > c/d.py"}`)),
		}, []FileTouch{ft("a/b.go", "edited"), ft("c/d.py", "created"), ft("c/e.py", "read"), group("tests/", "read", 40), group("./", "created", 1), ft("tests/new.py", "read")}},
		{"no file dropped past 300", many, manyWant},
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

// FileItems names every file while the list fits, then braces the files of
// a directory, then folds the deepest directories level by level.
func TestFileItems(t *testing.T) {
	small := []FileTouch{ft("src/a.go", "read"), ft("src/b.go", "read"), ft("src/c.go", "edited"), ft("README.md", "read")}
	deep := []FileTouch{
		ft("a/b/c/x.go", "read"), ft("a/b/c/y.go", "read"), ft("a/b/d/z.go", "edited"),
		ft("a/e.go", "read"), ft("/abs/p/q.txt", "read"), ft("top.md", "created"), group("old/dir/", "read", 5),
	}
	tests := []struct {
		name   string
		files  []FileTouch
		budget int
		want   []string
	}{
		{"each on its own when it fits", small, 1000, []string{"src/a.go (read)", "src/b.go (read)", "src/c.go (edited)", "README.md (read)"}},
		{"braced by directory and action", small, 70, []string{"src/{a.go,b.go} (read)", "src/c.go (edited)", "README.md (read)"}},
		{"fits whole", deep, 150, []string{"a/b/c/x.go (read)", "a/b/c/y.go (read)", "a/b/d/z.go (edited)", "a/e.go (read)", "/abs/p/q.txt (read)", "top.md (created)", "old/dir/** (read; 5 files)"}},
		{"braced", deep, 140, []string{"a/b/c/{x.go,y.go} (read)", "a/b/d/z.go (edited)", "a/e.go (read)", "/abs/p/q.txt (read)", "top.md (created)", "old/dir/** (read; 5 files)"}},
		{"the deepest directories fold first", deep, 120, []string{"a/b/** (edited; 3 files)", "a/e.go (read)", "/abs/** (read; 1 file)", "top.md (created)", "old/dir/** (read; 5 files)"}},
		{"then the next level", deep, 110, []string{"a/** (edited; 3 files)", "a/e.go (read)", "/** (read; 1 file)", "top.md (created)", "old/** (read; 5 files)"}},
		{"then the working directory", deep, 66, []string{"./** (edited; 9 files)", "/** (read; 1 file)", "top.md (created)"}},
		{"then the roots", deep, 60, []string{"./** (created; 10 files)", "/** (read; 1 file)"}},
		{"the roots even past the budget", deep, 10, []string{"./** (created; 10 files)", "/** (read; 1 file)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := FileItems(tt.files, tt.budget, 3)
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("FileItems(budget %d) = %q, want %q", tt.budget, got, tt.want)
			}
		})
	}
}

// Whatever its size, a rendered list stays within its bound and, read
// back, names or covers every file it was given, and a list read back and
// rendered again covers as much.
func TestRenderedListCoversEveryFile(t *testing.T) {
	for _, n := range []int{1, 50, 300, 2000, 20000} {
		var files []FileTouch
		for i := range n {
			p := fmt.Sprintf("repo/pkg%d/sub%d/name%d/file%05d.go", i%13, i%7, i%3, i)
			switch i % 5 {
			case 1:
				p = fmt.Sprintf("/testbed/lib%d/m%05d.py", i%4, i)
			case 2:
				p = fmt.Sprintf("f%05d.txt", i)
			}
			files = append(files, ft(p, []string{"read", "edited", "created"}[i%3]))
		}
		summary := RenderFilesTouched(files)
		marker := MarkerFiles(files, 2000)
		if len(summary) > len(FilesTouchedHeading)+maxFilesTouchedChars || len(marker) > len(MarkerFilesHeading)+2000 {
			t.Fatalf("%d files: summary list %d bytes, marker %d", n, len(summary), len(marker))
		}
		again := RenderFilesTouched(filesFromList("x\n\n" + summary))
		for _, text := range []string{summary, marker, again} {
			listed := filesFromList(text)
			for _, f := range files {
				if !slices.ContainsFunc(listed, func(l FileTouch) bool { return l.Covers(f.Path) }) {
					t.Fatalf("%d files: %s is neither named nor covered by\n%s", n, f.Path, text)
				}
			}
		}
	}
	if RenderFilesTouched(nil) != "" || MarkerFiles(nil, 100) != "" {
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
