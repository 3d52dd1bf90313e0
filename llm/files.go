package llm

import (
	"encoding/json"
	"regexp"
	"strconv"
	"strings"

	"github.com/ctxpipe/ctxpipe/prompts"
	"github.com/ctxpipe/ctxpipe/schema"
)

// Files touched (issue 13): every summary ends with a list of the files the
// summarized span read, edited or created, taken mechanically from the tool
// calls, so the paths survive whatever a model writes (or leaves out).

// FileTouch is one file of a span and what the span did to it.
type FileTouch struct {
	Path string
	// How is "created", "edited" or "read": the strongest action seen.
	How string
}

// Bounds on the list, so a span that lists a whole tree cannot make the
// summary grow without limit.
const (
	MaxFilesTouched      = 300
	maxFilesTouchedChars = 6_000
)

var (
	// writeTools and editTools are tool names (lower case, or a part of
	// one) that create or change the file they name.
	writeTools = []string{"write", "create", "save", "new_file"}
	editTools  = []string{"edit", "replace", "patch", "insert", "apply_diff", "str_replace", "search_and_replace", "multiedit"}
	// redirect finds the target of a shell write: > file, >> file, tee file.
	redirect = regexp.MustCompile(`(?:>>?|\btee\s+(?:-a\s+)?)\s*['"]?([^\s'";|&<>()]+)`)
	// sedInPlace finds sed -i, which edits the files it names.
	sedInPlace = regexp.MustCompile(`\bsed\s+(?:-[a-zA-Z]*i|--in-place)`)
)

// FilesTouched lists the files the tool calls of msgs name, in order of
// first appearance, each with the strongest action seen (created > edited
// > read). Paths come from the inputs' path keys (path, file_path,
// filename, …) and from the words of shell commands that look like paths;
// earlier summaries' lists are carried forward. The engine's final
// instruction turn is ignored.
func FilesTouched(msgs []schema.Message) []FileTouch {
	var out []FileTouch
	at := map[string]int{}
	rank := map[string]int{"read": 0, "edited": 1, "created": 2}
	add := func(p, how string) {
		if p == "" {
			return
		}
		if i, ok := at[p]; ok {
			if rank[how] > rank[out[i].How] {
				out[i].How = how
			}
			return
		}
		if len(out) == MaxFilesTouched {
			return
		}
		at[p] = len(out)
		out = append(out, FileTouch{Path: p, How: how})
	}
	for i, m := range msgs {
		if i == len(msgs)-1 && m.Role == schema.RoleUser && prompts.IsFinalInstruction(userText(m.Content)) {
			break
		}
		if m.IsCondenseSummary() {
			for _, f := range filesFromList(summaryText(m.Content)) {
				add(f.Path, f.How)
			}
			continue
		}
		for _, b := range m.Content.BlocksOf() {
			if b.Type == schema.BlockToolUse {
				touchedBy(b, add)
			}
		}
	}
	return out
}

// touchedBy reports the files one tool call names.
func touchedBy(b schema.Block, add func(path, how string)) {
	name := strings.ToLower(b.Name)
	how := "read"
	switch {
	case containsAny(name, editTools):
		how = "edited"
	case containsAny(name, writeTools):
		how = "created"
	}
	var input map[string]any
	_ = json.Unmarshal(b.Input, &input) // not an object: nothing to read
	for _, k := range pathKeys {
		for _, p := range stringsOf(input[k]) {
			add(explicitPath(p), how)
		}
	}
	for _, k := range commandKeys {
		for _, cmd := range stringsOf(input[k]) {
			written := map[string]string{}
			for _, line := range strings.Split(cmd, "\n") {
				for _, m := range redirect.FindAllStringSubmatch(line, -1) {
					if p := cleanPath(m[1]); p != "" {
						written[p] = "created"
					}
				}
				if strings.Contains(line, "<<") {
					break // the lines after a heredoc are file contents
				}
			}
			edits := sedInPlace.MatchString(cmd)
			for _, p := range pathsInCommand(cmd) {
				switch {
				case written[p] != "":
					add(p, written[p])
				case edits:
					add(p, "edited")
				default:
					add(p, "read")
				}
			}
		}
	}
}

func containsAny(s string, parts []string) bool {
	for _, p := range parts {
		if strings.Contains(s, p) {
			return true
		}
	}
	return false
}

// FilesTouchedHeading opens the list in a summary.
const FilesTouchedHeading = "## Files touched (listed mechanically from the tool calls)"

// RenderFilesTouched is the list as a summary section, "" when it is empty:
// one "- path (how)" line per file, bounded in size.
func RenderFilesTouched(files []FileTouch) string {
	if len(files) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString(FilesTouchedHeading)
	b.WriteByte('\n')
	for i, f := range files {
		line := "- " + f.Path + " (" + f.How + ")\n"
		if b.Len()+len(line) > maxFilesTouchedChars {
			b.WriteString("- … and " + strconv.Itoa(len(files)-i) + " more\n")
			break
		}
		b.WriteString(line)
	}
	return strings.TrimRight(b.String(), "\n")
}

// WithFilesTouched appends the files-touched section of msgs to a summary.
func WithFilesTouched(text string, msgs []schema.Message) string {
	if s := RenderFilesTouched(FilesTouched(msgs)); s != "" {
		return strings.TrimRight(text, "\n") + "\n\n" + s
	}
	return text
}

// fileLine reads a line of an earlier list back.
var fileLine = regexp.MustCompile(`^- (\S+) \((created|edited|read)\)$`)

// filesFromList reads the files-touched section of an earlier summary, so a
// second condense carries the first one's files forward.
func filesFromList(summary string) []FileTouch {
	i := strings.Index(summary, FilesTouchedHeading)
	if i < 0 {
		return nil
	}
	var out []FileTouch
	for _, line := range strings.Split(summary[i+len(FilesTouchedHeading):], "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "## ") {
			break
		}
		if m := fileLine.FindStringSubmatch(line); m != nil {
			out = append(out, FileTouch{Path: m[1], How: m[2]})
		}
	}
	return out
}

// Error lines. A tool's output reports an error on a line that names one
// (Error, Exception, FAILED, Traceback…) and is not source code that merely
// mentions one (an "except ValueError:" in a listing the agent read).
var (
	errorLinePattern = regexp.MustCompile(`(?:Error|Exception|exceptions?)\b|\berror\b|\bERROR\b|Traceback|FAILED`)
	codeLinePattern  = regexp.MustCompile(`^(?:[\w./-]+:\d+:\s*|\d+[:\s]\s*|[+-]\s*)?(?:raise|except|class|def|return|import|from|if|elif|else|assert|try|with|for|while|yield|lambda|await|self\.|#|//|/\*|\*|"|')`)
	boilerplateLines = map[string]bool{
		"Traceback (most recent call last):":                                   true,
		"During handling of the above exception, another exception occurred:":  true,
		"The above exception was the direct cause of the following exception:": true,
	}
	// maskedError is the last error line a masked stand-in carries.
	maskedError = regexp.MustCompile(`; last error: (.*)\. Run the call again to see it\.\]$`)
)

// MaskedPrefix opens a masked tool result's stand-in (stages.MaskPrefix;
// llm does not import the engine, and a stages test holds the two equal).
const MaskedPrefix = "[ctxpipe masked this tool result: "

// maxLastErrorChars bounds the verbatim last error line of a summary.
const maxLastErrorChars = 1000

// LastErrorLine is the last line of a tool's output that reports an error,
// white space collapsed, or "" when none does. A masked stand-in gives the
// error line it kept.
func LastErrorLine(out string) string {
	if t := strings.TrimSpace(out); strings.HasPrefix(t, MaskedPrefix) {
		if m := maskedError.FindStringSubmatch(t); m != nil {
			return m[1]
		}
	}
	// From the last line back, without splitting the whole output: tool
	// outputs run to megabytes and the error is usually near the end.
	for rest := out; rest != ""; {
		line := rest
		if i := strings.LastIndexByte(rest, '\n'); i >= 0 {
			line, rest = rest[i+1:], rest[:i]
		} else {
			rest = ""
		}
		if !mayReportError(line) || !errorLinePattern.MatchString(line) {
			continue
		}
		l := strings.Join(strings.Fields(line), " ")
		if l == "" || boilerplateLines[l] || codeLinePattern.MatchString(l) {
			continue
		}
		return clip(l, maxLastErrorChars)
	}
	return ""
}

// mayReportError is a cheap superset of errorLinePattern: most lines hold
// none of its words, and a substring test is far cheaper than the regexp.
func mayReportError(line string) bool {
	return strings.Contains(line, "rror") || strings.Contains(line, "RROR") || strings.Contains(line, "xception") ||
		strings.Contains(line, "Traceback") || strings.Contains(line, "FAILED")
}
