package textfacts

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"

	"github.com/ctxpipe/ctxpipe/prompts"
	"github.com/ctxpipe/ctxpipe/schema"
)

func callMsg(blocks ...schema.Block) schema.Message {
	return schema.Message{Turn: schema.Turn{Role: schema.RoleAssistant, Content: schema.BlockContent(blocks...)}}
}

func use(id, name, input string) schema.Block {
	return schema.Block{Type: schema.BlockToolUse, ID: id, Name: name, Input: json.RawMessage(input)}
}

func textMsg(role schema.Role, text string) schema.Message {
	return schema.Message{Turn: schema.Turn{Role: role, Content: schema.TextContent(text)}}
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
