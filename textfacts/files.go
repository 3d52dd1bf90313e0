package textfacts

import (
	"slices"
	"strings"

	"github.com/ctxpipe/ctxpipe/prompts"
	"github.com/ctxpipe/ctxpipe/schema"
)

// Files touched: every summary ends with a list of the files the
// summarized span read, edited or created, taken mechanically from the tool
// calls, so the paths survive whatever a model writes (or leaves out). The
// list is complete: past its size bound it names files by directory
// (FileItems), never by dropping some.

// FileTouch is one file of a span and what the span did to it, or a
// directory group that stands for files under it.
type FileTouch struct {
	// Path is the file's path; for a group, its directory with a
	// trailing slash ("./" for the working directory's tree).
	Path string
	// How is "created", "edited" or "read": the strongest action seen.
	How string
	// Files is, for a group, how many files of the list it stands for,
	// and 0 for a file.
	Files int
}

// MaxFileListChars bounds the list in a summary, so a span that lists
// a whole tree cannot make the summary grow without limit.
const MaxFileListChars = 6_000

var (
	// writeTools and editTools are tool names (lower case, or a part of
	// one) that create or change the file they name.
	writeTools = []string{"write", "create", "save", "new_file"}
	editTools  = []string{"edit", "replace", "patch", "insert", "apply_diff", "str_replace", "search_and_replace", "multiedit"}
)

// FilesTouched lists the files the tool calls of msgs name, in order of
// first appearance, each with the strongest action seen (created > edited
// > read). Paths come from the inputs' path keys (path, file_path,
// filename, …) and from the words of shell commands that look like paths;
// the lists of earlier summaries and of truncation markers are carried
// forward. The engine's final instruction turn is ignored.
func FilesTouched(msgs []schema.Message) []FileTouch {
	var t Touched
	for i, m := range msgs {
		if i == len(msgs)-1 && m.Role == schema.RoleUser && prompts.IsFinalInstruction(userText(m.Content)) {
			break
		}
		if m.IsCondenseSummary() {
			t.Carry(summaryText(m.Content))
			continue
		}
		if m.IsTruncationMarker {
			t.Carry(userText(m.Content))
		}
		for _, b := range m.Content.BlocksOf() {
			if b.Type == schema.BlockToolUse {
				t.Call(b, ReadToolInput(b.Input))
			}
		}
	}
	return t.out
}

// userText joins a message's text blocks, leaving out tool results.
func userText(c schema.Content) string { return c.OwnText("\n\n") }

// summaryText is an earlier summary's text, without its synthetic reasoning.
func summaryText(c schema.Content) string { return strings.TrimSpace(userText(c)) }

// Touched builds FilesTouched's list message by message, for a reader that
// gathers other facts in the same pass (the offline condenser): each tool
// input is then decoded and scanned once, not once per reader. The zero
// value is an empty list.
type Touched struct {
	out []FileTouch
	at  map[string]int // path (a group's with "**") → index in out
}

// List is the list so far, in order of first appearance.
func (t *Touched) List() []FileTouch { return t.out }

// howRank orders the actions, so a later, stronger one replaces a weaker.
func howRank(how string) int {
	switch how {
	case "created":
		return 2
	case "edited":
		return 1
	}
	return 0
}

func (t *Touched) add(p, how string) { t.addEntry(FileTouch{Path: p, How: how}) }

// addEntry adds a file, or a group whose count adds to an equal one's.
func (t *Touched) addEntry(f FileTouch) {
	if f.Path == "" {
		return
	}
	key := f.Path
	if f.Files > 0 {
		key += "**"
	}
	if i, ok := t.at[key]; ok {
		if howRank(f.How) > howRank(t.out[i].How) {
			t.out[i].How = f.How
		}
		t.out[i].Files += f.Files
		return
	}
	if t.at == nil {
		t.at = map[string]int{}
	}
	t.at[key] = len(t.out)
	t.out = append(t.out, f)
}

// Carry adds the lists of an earlier summary's or a marker's text.
func (t *Touched) Carry(text string) {
	for _, f := range filesFromList(text) {
		t.addEntry(f)
	}
}

// touchOf is how a tool of that name touches the files it names: "edited"
// or "created" by an edit or write tool, else "read".
func touchOf(tool string) string {
	name := strings.ToLower(tool)
	switch {
	case containsAny(name, editTools):
		return "edited"
	case containsAny(name, writeTools):
		return "created"
	}
	return "read"
}

// Call adds the files one tool call names.
func (t *Touched) Call(b schema.Block, in ToolInput) {
	how := touchOf(b.Name)
	for _, p := range in.Paths {
		t.add(ExplicitPath(p), how)
	}
	var written []string // few per command: a slice beats a map
	for _, c := range in.Commands {
		written = written[:0]
		for lines := (commandLines{rest: c.Text}); ; {
			line, ok := lines.next()
			if !ok {
				break
			}
			n := len(written)
			written = writeTargets(line, written)
			for k := n; k < len(written); k++ {
				written[k] = cleanPath(written[k]) // "" when not a path: matches nothing
			}
		}
		edits := editsInPlace(c.Text)
		for _, p := range c.Paths {
			switch {
			case slices.Contains(written, p):
				t.add(p, "created")
			case edits:
				t.add(p, "edited")
			default:
				t.add(p, "read")
			}
		}
	}
}
