package quality

import (
	"encoding/json"
	"reflect"
	"slices"
	"testing"

	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/textfacts"
)

// Builders for hand-made histories.

func text(s string) schema.Block { return schema.Block{Type: schema.BlockText, Text: s} }

func use(id, name, input string) schema.Block {
	return schema.Block{Type: schema.BlockToolUse, ID: id, Name: name, Input: json.RawMessage(input)}
}

func result(id, out string, isErr bool) schema.Block {
	c := schema.TextContent(out)
	return schema.Block{Type: schema.BlockToolResult, ToolUseID: id, Content: &c, IsError: isErr}
}

func msg(id string, role schema.Role, blocks ...schema.Block) schema.Message {
	return schema.Message{Turn: schema.Turn{ID: id, Role: role, Content: schema.BlockContent(blocks...)}, Tokens: 10}
}

func TestPathsInText(t *testing.T) {
	cases := []struct {
		name, in string
		want     []string
	}{
		{"absolute and relative", "edit /testbed/django/forms/widgets.py and ./setup.py", []string{"/testbed/django/forms/widgets.py", "setup.py"}},
		{"line reference dropped", "see astropy/modeling/separable.py:242: in _cstack", []string{"astropy/modeling/separable.py"}},
		{"column reference dropped", "src/a.go:12:5: undefined: x", []string{"src/a.go"}},
		{"quoted and backticked", "I changed `lib/util.py` (and \"tests/test_util.py\").", []string{"lib/util.py", "tests/test_util.py"}},
		{"bare name needs a source extension", "run conftest.py, not os.path or e.g. or version 1.2.3", []string{"conftest.py"}},
		{"directory with two slashes", "cd django/db/models then", []string{"django/db/models"}},
		{"one slash without extension is prose", "and/or input/output", nil},
		{"urls are not paths", "see https://github.com/org/repo/blob/main/x.py", nil},
		{"options are not paths", "pytest --rootdir=/tmp -k test", []string{"/tmp"}},
		{"home-relative", "cat ~/notes", []string{"~/notes"}},
		{"numbers are not paths", "1/2/3 and 10.5", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := PathsInText(c.in); !slices.Equal(got, c.want) {
				t.Fatalf("PathsInText(%q) = %q, want %q", c.in, got, c.want)
			}
		})
	}
}

func TestPathsInInput(t *testing.T) {
	cases := []struct {
		name, in string
		want     []string
	}{
		{"named key takes any name", `{"path":"Makefile"}`, []string{"Makefile"}},
		{"file_path", `{"file_path":"./src/main.rs","content":"fn main() {}"}`, []string{"src/main.rs"}},
		{"filename and keys in order", `{"old":"x","filename":"reproduce.py"}`, []string{"reproduce.py"}},
		{"paths array", `{"paths":["a/b.go","README"]}`, []string{"a/b.go", "README"}},
		{"command words", `{"command":"cd /testbed && python -m pytest tests/test_x.py -q"}`, []string{"/testbed", "tests/test_x.py"}},
		{"named value with spaces falls back to words", `{"path":"the file src/x.py"}`, []string{"src/x.py"}},
		{"not json", `cat a/b/c.txt`, []string{"a/b/c.txt"}},
		{"empty", ``, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := PathsInInput(json.RawMessage(c.in)); !slices.Equal(got, c.want) {
				t.Fatalf("PathsInInput(%s) = %q, want %q", c.in, got, c.want)
			}
		})
	}
}

func TestErrorLines(t *testing.T) {
	cases := []struct {
		name, in string
		want     []string
	}{
		{"traceback keeps the exception, not the header or code",
			"Traceback (most recent call last):\n  File \"x.py\", line 3, in <module>\n    raise ValueError(\"bad\")\nValueError: bad   value\n",
			[]string{"ValueError: bad value"}},
		{"dotted exception", "django.core.exceptions.ImproperlyConfigured: Requested setting", []string{"django.core.exceptions.ImproperlyConfigured: Requested setting"}},
		{"tool error and pytest", "error: pathspec 'x' did not match\nok\nFAILED tests/test_a.py::test_b - assert 1 == 2", []string{"error: pathspec 'x' did not match", "FAILED tests/test_a.py::test_b - assert 1 == 2"}},
		{"code listings are not errors",
			"   120\t        except KeyError:\n   121\t            raise TypeError('x')\nsrc/m.py:40:    except ValueError:\nclass MyError(Exception):",
			nil},
		{"chained traceback boilerplate", "During handling of the above exception, another exception occurred:\n\nRuntimeError: again", []string{"RuntimeError: again"}},
		{"words inside other words", "terrorist errors mirror", nil},
		{"timeout", "<exception>Command timed out</exception>", []string{"<exception>Command timed out</exception>"}},
		{"nothing", "all 12 tests passed", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := ErrorLines(c.in); !slices.Equal(got, c.want) {
				t.Fatalf("ErrorLines(%q) = %q, want %q", c.in, got, c.want)
			}
		})
	}
}

func TestShellCommand(t *testing.T) {
	cases := []struct {
		name string
		b    schema.Block
		want string
	}{
		{"bash command normalized", use("1", "bash", `{"command":"cd /x &&\n   ls -la"}`), "cd /x && ls -la"},
		{"case-insensitive name, cmd key", use("1", "Bash", `{"cmd":"make test"}`), "make test"},
		{"argv array", use("1", "local_shell", `{"command":["git","status"]}`), "git status"},
		{"execute_command", use("1", "execute_command", `{"command":"npm test","cwd":"/app"}`), "npm test"},
		{"not a shell tool", use("1", "edit", `{"command":"str_replace"}`), ""},
		{"no command", use("1", "bash", `{"restart":true}`), ""},
		{"not a tool call", text("bash -c ls"), ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := ShellCommand(c.b); got != c.want {
				t.Fatalf("ShellCommand = %q, want %q", got, c.want)
			}
		})
	}
}

func TestExtract(t *testing.T) {
	span := []schema.Message{
		msg("a1", schema.RoleAssistant, schema.Block{Type: schema.BlockReasoning, Text: "maybe secret/plan.py"},
			text("Let me look at src/app.py"), use("c1", "bash", `{"command":"python src/app.py"}`)),
		msg("u1", schema.RoleUser, result("c1", "Traceback (most recent call last):\nKeyError: 'x'", true)),
		msg("a2", schema.RoleAssistant, use("c2", "str_replace_editor", `{"command":"view","path":"src/app.py"}`)),
		msg("u2", schema.RoleUser, result("c2", "KeyError: 'x'\nTypeError: y", false)),
		msg("a3", schema.RoleAssistant, use("c3", "bash", `{"command":"python src/app.py"}`)),
	}
	f := Extract(span)
	want := Facts{
		Paths:    []string{"src/app.py"}, // reasoning left out, duplicates once
		Errors:   []string{"KeyError: 'x'", "TypeError: y"},
		Commands: []string{"python src/app.py"}, // str_replace_editor is not a shell
	}
	if !slices.Equal(f.Paths, want.Paths) || !slices.Equal(f.Errors, want.Errors) || !slices.Equal(f.Commands, want.Commands) {
		t.Fatalf("Extract = %+v, want %+v", f, want)
	}
	if got := lastErrorLine(span); got != "TypeError: y" {
		t.Fatalf("last error line %q", got)
	}
}

// A stand-in's error line is the one it quotes; one that quotes none has none.
func TestErrorLinesOfStandIns(t *testing.T) {
	tests := []struct {
		out  string
		want []string
	}{
		{textfacts.MaskPrefix + `bash command="make"; 90 tokens, 4 lines hidden; last error: make: *** [all]  Error 2. Run the call again to see it.]`, []string{"make: *** [all] Error 2"}},
		{textfacts.MaskPrefix + `read_file path="a.go"; 90 tokens, 4 lines hidden; it reported an error. Run the call again to see it.]`, nil},
	}
	for _, tt := range tests {
		if got := ErrorLines(tt.out); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("ErrorLines(%q) = %q, want %q", tt.out, got, tt.want)
		}
	}
}
