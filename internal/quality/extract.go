package quality

import (
	"encoding/json"
	"regexp"
	"sort"
	"strings"
	"unicode"

	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/textfacts"
)

// Facts are what a reduction must not lose, pulled mechanically out of a
// span of messages. Each list is deduplicated and in order of appearance;
// every item is whitespace-normalized (see Normalize), as the haystack it is
// looked up in.
type Facts struct {
	Paths    []string
	Errors   []string
	Commands []string
}

// Extract pulls the facts out of msgs:
//   - paths: the values of tool inputs that name a file (path, file_path,
//     filename, …) and path-like words in text blocks and in every string of
//     a tool input (commands name most files an agent touches). Tool output is
//     not searched: find and grep list paths the agent never worked on, which
//     would drown the measure.
//   - errors: lines of tool results that look like an error report.
//   - commands: the command of a shell tool call.
//
// Reasoning blocks are left out: they are the model's scratch work, and an
// agent that hides them loses nothing it relied on.
func Extract(msgs []schema.Message) Facts {
	var f Facts
	paths, errs, cmds := newSet(), newSet(), newSet()
	for i := range msgs {
		for _, b := range msgs[i].Content.BlocksOf() {
			switch b.Type {
			case schema.BlockText:
				for _, p := range PathsInText(b.Text) {
					paths.add(p)
				}
			case schema.BlockToolUse:
				for _, p := range PathsInInput(b.Input) {
					paths.add(p)
				}
				if c := ShellCommand(b); c != "" {
					cmds.add(c)
				}
			case schema.BlockToolResult:
				if b.Content != nil {
					for _, l := range ErrorLines(contentText(*b.Content)) {
						errs.add(l)
					}
				}
			}
		}
	}
	f.Paths, f.Errors, f.Commands = paths.list, errs.list, cmds.list
	return f
}

// set is an insertion-ordered set of strings.
type set struct {
	seen map[string]bool
	list []string
}

func newSet() *set { return &set{seen: map[string]bool{}} }

func (s *set) add(v string) {
	if v == "" || s.seen[v] {
		return
	}
	s.seen[v] = true
	s.list = append(s.list, v)
}

// Normalize collapses every run of white space into one space and trims the
// ends. Facts and haystacks are compared in this form, so a summary that
// reflows a command or an indented error line still counts as keeping it.
func Normalize(s string) string { return strings.Join(strings.Fields(s), " ") }

// pathKeys are tool-input keys whose value names a file or directory
// (Claude Code, Roo, SWE-agent and Gemini CLI spell them these ways).
var pathKeys = map[string]bool{
	"path": true, "file_path": true, "filepath": true, "filename": true, "file_name": true,
	"file": true, "absolute_path": true, "dir": true, "dir_path": true, "directory": true,
	"paths": true, "files": true, "target_file": true, "notebook_path": true,
}

// PathsInInput finds the paths of a tool input: the values under pathKeys as
// they are, and path-like words in every other string (commands, patterns).
func PathsInInput(raw json.RawMessage) []string {
	if len(raw) == 0 {
		return nil
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		// An input that is not JSON is still text a path may hide in.
		return PathsInText(string(raw))
	}
	var out []string
	walkInput(v, false, func(s string, named bool) {
		if named {
			if p := explicitPath(s); p != "" {
				out = append(out, p)
				return
			}
		}
		out = append(out, PathsInText(s)...)
	})
	return out
}

// walkInput calls f for every string in v, with named set when the string
// sits under one of pathKeys.
func walkInput(v any, named bool, f func(s string, named bool)) {
	switch t := v.(type) {
	case string:
		f(t, named)
	case []any:
		for _, e := range t {
			walkInput(e, named, f)
		}
	case map[string]any:
		// In key order: the same input always gives the same text.
		keys := make([]string, 0, len(t))
		for k := range t {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			walkInput(t[k], pathKeys[strings.ToLower(k)], f)
		}
	}
}

// explicitPath accepts a value given under a path key: one line of path
// characters, no slash or extension needed.
func explicitPath(s string) string {
	s = strings.TrimPrefix(strings.TrimSpace(s), "./")
	if len(s) < 2 || len(s) > 256 || strings.ContainsAny(s, " \t\n") {
		return ""
	}
	for _, r := range s {
		if !isPathRune(r) {
			return ""
		}
	}
	return s
}

// sourceExts make a bare file name (no slash) count as a path.
var sourceExts = map[string]bool{
	"py": true, "pyi": true, "pyx": true, "go": true, "js": true, "mjs": true, "ts": true,
	"tsx": true, "jsx": true, "rs": true, "c": true, "h": true, "cc": true, "cpp": true,
	"hpp": true, "java": true, "kt": true, "rb": true, "php": true, "sh": true, "md": true,
	"rst": true, "txt": true, "json": true, "jsonl": true, "yaml": true, "yml": true,
	"toml": true, "cfg": true, "ini": true, "sql": true, "html": true, "css": true,
	"xml": true, "csv": true, "lock": true, "mod": true, "patch": true, "diff": true,
	"log": true, "ipynb": true, "proto": true, "swift": true, "scala": true, "vue": true,
}

// lineRef is a trailing line (and column) reference, as in "a.py:12:5".
var lineRef = regexp.MustCompile(`(:\d+)+$`)

// PathsInText finds the path-like words of a text: words made of path
// characters that either hold a slash and look like a file path (an
// extension on the last part, a leading / or ~/, or two slashes or more) or
// are a bare name with a source-file extension. "./" and a trailing
// ":line" are dropped; URLs and options are not paths.
func PathsInText(s string) []string {
	var out []string
	words := strings.FieldsFunc(s, func(r rune) bool { return !isPathRune(r) && r != ':' })
	for _, w := range words {
		if strings.Contains(w, "//") && strings.Contains(w, ":") {
			continue // a URL
		}
		w = strings.TrimLeft(strings.TrimRight(w, ".:"), ":") // a leading dot is part of ./x and .env
		w = lineRef.ReplaceAllString(w, "")
		w = strings.TrimRight(w, ".:")
		w = strings.TrimPrefix(w, "./")
		if strings.Contains(w, ":") || strings.HasPrefix(w, "-") || len(w) < 3 || len(w) > 256 {
			continue
		}
		if looksLikePath(w) {
			out = append(out, w)
		}
	}
	return out
}

func looksLikePath(w string) bool {
	if !strings.ContainsFunc(w, unicode.IsLetter) {
		return false
	}
	last := w[strings.LastIndexByte(w, '/')+1:]
	ext := ""
	if i := strings.LastIndexByte(last, '.'); i > 0 && i < len(last)-1 {
		ext = last[i+1:]
	}
	if !strings.Contains(w, "/") {
		return sourceExts[strings.ToLower(ext)]
	}
	if strings.Contains(w, "//") {
		return false
	}
	hasExt := ext != "" && len(ext) <= 8 && strings.ContainsFunc(ext, unicode.IsLetter)
	return hasExt || strings.HasPrefix(w, "/") || strings.HasPrefix(w, "~/") || strings.Count(w, "/") >= 2
}

func isPathRune(r rune) bool {
	return r < unicode.MaxASCII && (unicode.IsLetter(r) || unicode.IsDigit(r) || strings.ContainsRune("_./~+@-", r))
}

// errorLine matches a line that reports an error: a Python exception line
// (ValueError: …, django.core.exceptions.ImproperlyConfigured: …), "error:"
// from compilers and tools, a traceback, pytest's FAILED, <exception>.
var errorLine = regexp.MustCompile(`(?:Error|Exception|exceptions?)\b|\berror\b|\bERROR\b|Traceback|FAILED`)

// codeLine matches a line of source code, as cat, sed -n, grep -n and
// tracebacks print it (after an optional "file:line:" or line number):
// "except ValueError:" in a listing is code the agent read, not an error
// it met.
var codeLine = regexp.MustCompile(`^(?:[\w./-]+:\d+:\s*|\d+[:\s]\s*|[+-]\s*)?(?:raise|except|class|def|return|import|from|if|elif|else|assert|try|with|for|while|yield|lambda|await|self\.|#|//|/\*|\*|"|')`)

// boilerplate are error lines that name no error.
var boilerplate = map[string]bool{
	"Traceback (most recent call last):":                                   true,
	"During handling of the above exception, another exception occurred:":  true,
	"The above exception was the direct cause of the following exception:": true,
}

// standInError finds the error line a stand-in quotes.
var standInError = regexp.MustCompile(`; last error: (.*)\. Run the call again to see it\.\]$`)

// ErrorLines returns the normalized lines of a tool output that report an
// error, in order: lines matching errorLine that are neither source code
// nor traceback boilerplate.
//
// A masked stand-in (textfacts.MaskPrefix) is one line that names the call and
// quotes the last error line of the output it replaced: that quoted line is
// its error line, not the stand-in itself.
func ErrorLines(out string) []string {
	if strings.HasPrefix(out, textfacts.MaskPrefix) {
		if m := standInError.FindStringSubmatch(out); m != nil {
			return []string{Normalize(m[1])}
		}
		return nil
	}
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if !errorLine.MatchString(l) {
			continue
		}
		n := Normalize(l)
		if n == "" || boilerplate[n] || codeLine.MatchString(n) {
			continue
		}
		lines = append(lines, n)
	}
	return lines
}

// shellTools are tool names (lower case) that run a shell command.
var shellTools = map[string]bool{
	"bash": true, "sh": true, "shell": true, "zsh": true, "terminal": true, "run": true,
	"exec": true, "execute": true, "execute_command": true, "run_command": true,
	"run_shell_command": true, "run_terminal_cmd": true, "local_shell": true,
}

// ShellCommand is the normalized command of a shell tool call: the input's
// command or cmd (a string, or an argv array joined by spaces), or "" when b
// is not one.
func ShellCommand(b schema.Block) string {
	if b.Type != schema.BlockToolUse || !shellTools[strings.ToLower(b.Name)] {
		return ""
	}
	var in map[string]any
	if err := json.Unmarshal(b.Input, &in); err != nil {
		return ""
	}
	for _, k := range []string{"command", "cmd"} {
		switch v := in[k].(type) {
		case string:
			return Normalize(v)
		case []any:
			parts := make([]string, 0, len(v))
			for _, e := range v {
				if s, ok := e.(string); ok {
					parts = append(parts, s)
				}
			}
			return Normalize(strings.Join(parts, " "))
		}
	}
	return ""
}

// contentText is the text of a content: its text blocks and, recursively,
// the content of nested tool results.
func contentText(c schema.Content) string {
	if !c.IsBlocks {
		return c.Text
	}
	var b strings.Builder
	for _, bl := range c.Blocks {
		switch bl.Type {
		case schema.BlockText:
			b.WriteString(bl.Text)
			b.WriteByte('\n')
		case schema.BlockToolResult:
			if bl.Content != nil {
				b.WriteString(contentText(*bl.Content))
				b.WriteByte('\n')
			}
		}
	}
	return b.String()
}

// UserText is the text a user turn says in its own words: its text blocks,
// without tool results. It is "" for a turn that only returns tool results.
func UserText(c schema.Content) string { return c.OwnText("\n") }

// Haystack is everything an agent's model reads in msgs, as text: text,
// reasoning, each tool call's name, raw input and the strings inside it (so
// a quoted command is found unescaped), and tool results. Raw keeps the
// bytes; Norm is the same text normalized, for looking up facts.
type Haystack struct {
	Raw  string
	Norm string
}

// NewHaystack renders msgs.
func NewHaystack(msgs []schema.Message) Haystack {
	var b strings.Builder
	for i := range msgs {
		for _, bl := range msgs[i].Content.BlocksOf() {
			switch bl.Type {
			case schema.BlockText, schema.BlockReasoning:
				b.WriteString(bl.Text)
			case schema.BlockToolUse:
				b.WriteString(bl.Name)
				b.WriteByte(' ')
				b.Write(bl.Input)
				var v any
				if json.Unmarshal(bl.Input, &v) == nil {
					walkInput(v, false, func(s string, _ bool) {
						b.WriteByte('\n')
						b.WriteString(s)
					})
				}
			case schema.BlockToolResult:
				if bl.Content != nil {
					b.WriteString(contentText(*bl.Content))
				}
			}
			b.WriteByte('\n')
		}
		b.WriteByte('\n')
	}
	raw := b.String()
	return Haystack{Raw: raw, Norm: Normalize(raw)}
}
