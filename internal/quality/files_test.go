package quality

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/ctxpipe/ctxpipe/condense"
)

func TestShellWords(t *testing.T) {
	cases := []struct {
		name, in string
		want     []string
	}{
		{"operators split", "cd /testbed&&cat a.py|head -5;ls>out.txt 2>/dev/null", []string{"cd", "/testbed", "cat", "a.py", "head", "-5", "ls", "out.txt", "2", "/dev/null"}},
		{"quotes join", `grep -n "def foo" 'src/my file.py' x\ y.go`, []string{"grep", "-n", "def foo", "src/my file.py", "x y.go"}},
		{"double quotes keep escapes of their own", `echo "a \"b\" \$c \d"`, []string{"echo", `a "b" $c \d`}},
		{"comments", "ls # not/a/path.py\ncat b.py", []string{"ls", "cat", "b.py"}},
		{"a # inside a word", "echo a#b.py", []string{"echo", "a#b.py"}},
		{"here document bodies skipped", "cat > fix.py << 'EOF'\nopen('in/body.py')\nEOF\npython fix.py", []string{"cat", "fix.py", "python", "fix.py"}},
		{"two here documents, indented close", "cat <<A >a.md; cat <<-\"B\" >b.md\nx/y.py\nA\nz/w.py\n\tB\nls c.go", []string{"cat", "a.md", "cat", "b.md", "ls", "c.go"}},
		{"a here-string is not a here document", "grep x <<< 'q/r.py'\ncat s.go", []string{"grep", "x", "q/r.py", "cat", "s.go"}},
		{"an unclosed body runs to the end", "cat <<EOF >a.md\nb/c.py", []string{"cat", "a.md"}},
		{"line continuation", "python \\\n  run.py", []string{"python", "run.py"}},
		{"multi-line quoted script", "python -c \"\nimport x\nprint(1)\n\" && cat d.py", []string{"python", "-c", "\nimport x\nprint(1)\n", "cat", "d.py"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := ShellWords(c.in); !slices.Equal(got, c.want) {
				t.Fatalf("ShellWords(%q) = %q, want %q", c.in, got, c.want)
			}
		})
	}
}

func TestFilesInInput(t *testing.T) {
	cases := []struct {
		name, in string
		want     []string
	}{
		{"path keys as they are", `{"path":"Makefile","file_path":"./src/main.rs","content":"see other/file.rs"}`, []string{"Makefile", "src/main.rs"}},
		{"path arrays", `{"paths":["a/b.go","README"]}`, []string{"a/b.go", "README"}},
		{"command words", `{"command":"cd /testbed && python -m pytest tests/test_x.py::test_y -q --rootdir=/tmp"}`, []string{"/testbed", "tests/test_x.py", "/tmp"}},
		{"line references", `{"command":"vim src/a.go:12:5"}`, []string{"src/a.go"}},
		{"not files: devices, globs, sed and awk scripts, quoted prose", `{"command":"find . -path \"*/tests/*\" -name '*.py' 2>/dev/null; sed -i 's/collections\\.Mapping/Mapping/g' m/a.py; awk '/x/ {print}' b/c.txt; git commit -m \"fix src/d.py\""}`, []string{"m/a.py", "b/c.txt"}},
		{"here document body is content", `{"command":"cat > /tmp/fix.py << 'EOF'\n#!/usr/bin/env python\nwith open('django/x.py') as f: pass\nEOF\ncd /testbed && python /tmp/fix.py && mv a/b.py.new a/b.py"}`, []string{"/tmp/fix.py", "/testbed", "/tmp/fix.py", "a/b.py.new", "a/b.py"}},
		{"argv arrays", `{"cmd":["cat","x/y.go","*.go"]}`, []string{"x/y.go"}},
		{"other keys name no file", `{"old_str":"a/b.py","new_str":"c/d.py","pattern":"e/f.py"}`, nil},
		{"not an object", `["a/b.py"]`, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := FilesInInput(json.RawMessage(c.in))
			slices.Sort(got)
			want := slices.Clone(c.want)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Fatalf("FilesInInput(%s) = %q, want %q", c.in, got, want)
			}
		})
	}
}

// filesHardRuns are shared runs whose reductions lost a file before the
// list was made complete (a command after a here document, inputs clipped
// for a masking profile): the replay under the race detector or -short.
var filesHardRuns = map[string]bool{
	"msa_deepseek-chat_django__django-13964":     true,
	"msa_deepseek-chat_pvlib__pvlib-python-1707": true,
	"msa_deepseek-chat_pyvista__pyvista-4315":    true,
}

// Every file the hidden span's tool calls name is still named after every
// reduction of every shared run, under every row: the summaries' and the
// markers' files-touched lists are complete. (make quality reports the
// same figure pooled over the runs.)
func TestEveryTouchedFileKept(t *testing.T) {
	ts, err := Load(transcriptDir)
	if err != nil {
		t.Fatal(err)
	}
	if raceEnabled || testing.Short() {
		ts = slices.DeleteFunc(ts, func(tr Transcript) bool { return !filesHardRuns[tr.Name] })
		if len(ts) != len(filesHardRuns) {
			t.Fatalf("%d of the %d runs found", len(ts), len(filesHardRuns))
		}
	}
	rows := Rows()
	runs, err := ReplayAll(context.Background(), ts, rows, BaseProfile(32000, 70), &condense.Offline{}, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	for ri, row := range rows {
		s := Summarize(row.Name, runs[ri])
		if s.FilesKeptPooled.N == 0 {
			t.Fatalf("%s: no reduction hid a file", row.Name)
		}
		for _, run := range runs[ri] {
			for _, r := range run.Reductions {
				if r.Files.Kept != r.Files.Total || len(r.FilesLost) > 0 {
					t.Errorf("%s/%s turn %d %v: %d of %d files kept; lost %q", row.Name, run.Transcript, r.Turn, r.Events, r.Files.Kept, r.Files.Total, r.FilesLost)
				}
			}
		}
		if s.FilesKeptPooled.Value != 1 || s.FilesKept.Value != 1 {
			t.Errorf("%s: files kept %v at the median, %v pooled", row.Name, s.FilesKept, s.FilesKeptPooled)
		}
	}
}
