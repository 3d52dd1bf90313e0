package llm

import (
	"bytes"
	"encoding/json"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

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
)

// FilesTouched lists the files the tool calls of msgs name, in order of
// first appearance, each with the strongest action seen (created > edited
// > read). Paths come from the inputs' path keys (path, file_path,
// filename, …) and from the words of shell commands that look like paths;
// earlier summaries' lists are carried forward. The engine's final
// instruction turn is ignored.
func FilesTouched(msgs []schema.Message) []FileTouch {
	var t touchList
	for i, m := range msgs {
		if i == len(msgs)-1 && m.Role == schema.RoleUser && prompts.IsFinalInstruction(userText(m.Content)) {
			break
		}
		if m.IsCondenseSummary() {
			t.carry(summaryText(m.Content))
			continue
		}
		for _, b := range m.Content.BlocksOf() {
			if b.Type == schema.BlockToolUse {
				t.call(b, readToolInput(b.Input))
			}
		}
	}
	return t.out
}

// touchList builds FilesTouched's list. The offline condenser fills one in
// the same pass as its other facts, so each tool input is decoded and
// scanned once per summary, not once for the facts and again for the list.
type touchList struct {
	out []FileTouch
	at  map[string]int // path → index in out
}

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

func (t *touchList) add(p, how string) {
	if p == "" {
		return
	}
	if i, ok := t.at[p]; ok {
		if howRank(how) > howRank(t.out[i].How) {
			t.out[i].How = how
		}
		return
	}
	if len(t.out) == MaxFilesTouched {
		return
	}
	if t.at == nil {
		t.at = map[string]int{}
	}
	t.at[p] = len(t.out)
	t.out = append(t.out, FileTouch{Path: p, How: how})
}

// carry adds the list of an earlier summary's text.
func (t *touchList) carry(summary string) {
	for _, f := range filesFromList(summary) {
		t.add(f.Path, f.How)
	}
}

// call adds the files one tool call names.
func (t *touchList) call(b schema.Block, in toolInput) {
	name := strings.ToLower(b.Name)
	how := "read"
	switch {
	case containsAny(name, editTools):
		how = "edited"
	case containsAny(name, writeTools):
		how = "created"
	}
	for _, p := range in.paths {
		t.add(explicitPath(p), how)
	}
	var written []string // few per command: a slice beats a map
	for _, c := range in.commands {
		written = written[:0]
		for rest := c.text; ; {
			line, more, found := strings.Cut(rest, "\n")
			n := len(written)
			written = writeTargets(line, written)
			for k := n; k < len(written); k++ {
				written[k] = cleanPath(written[k]) // "" when not a path: matches nothing
			}
			if !found || strings.Contains(line, "<<") {
				break // the lines after a heredoc are file contents
			}
			rest = more
		}
		edits := editsInPlace(c.text)
		for _, p := range c.paths {
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

// toolInput is what the extraction reads of a tool call's input, decoded
// once for the facts and the files list alike.
type toolInput struct {
	// paths are the strings under the path keys, in pathKeys order, as
	// given (explicitPath decides which are paths).
	paths []string
	// commands are the strings under the command keys, in commandKeys
	// order, each with the paths its words name.
	commands []command
}

// command is one shell command of a tool input.
type command struct {
	key   int // index in commandKeys
	text  string
	paths []string // pathsInCommand(text)
}

// readToolInput reads the path and command strings of a tool call's input,
// and the paths each command names, as encoding/json would decode the
// input into a map: the common shapes through scanStringObject, the rest
// through encoding/json itself.
func readToolInput(raw []byte) toolInput {
	var in toolInput
	var strs func(key string) []string
	if ms, ok := scanStringObject(raw); ok {
		strs = func(key string) []string {
			// The last member of a name wins, as in encoding/json's map.
			for i := len(ms) - 1; i >= 0; i-- {
				if string(ms[i].key) == key {
					v := string(ms[i].val)
					if ms[i].escaped {
						v = unescapeJSON(ms[i].val)
					}
					return stringsOf(v)
				}
			}
			return nil
		}
	} else {
		var input map[string]any
		_ = json.Unmarshal(raw, &input) // not an object: nothing to read
		if len(input) == 0 {
			return in
		}
		strs = func(key string) []string { return stringsOf(input[key]) }
	}
	for _, k := range pathKeys {
		in.paths = append(in.paths, strs(k)...)
	}
	for i, k := range commandKeys {
		for _, cmd := range strs(k) {
			in.commands = append(in.commands, command{key: i, text: cmd, paths: pathsInCommand(cmd)})
		}
	}
	return in
}

// member is one "name": "value" of a tool input, as scanStringObject found
// it: both raw, between their quotes.
type member struct {
	key, val []byte
	escaped  bool // val holds backslash escapes
}

// scanStringObject reads raw when it has the common shape of a tool input,
// {"command": "…"}: a JSON object whose names hold no escapes and whose
// values are all strings of valid UTF-8 with no control character and no
// \u escape. ok is false for anything else (arrays, numbers, nested
// objects, \u, invalid JSON…), which the caller gives to encoding/json. On
// what it takes, the two agree exactly (a test and a fuzz target hold them
// equal). It exists because encoding/json's decode into a map of
// interfaces cost more than all of the path extraction together.
func scanStringObject(raw []byte) (ms []member, ok bool) {
	if !utf8.Valid(raw) {
		return nil, false // encoding/json replaces invalid bytes: leave it to it
	}
	i := skipJSONSpace(raw, 0)
	if i == len(raw) || raw[i] != '{' {
		return nil, false
	}
	i = skipJSONSpace(raw, i+1)
	if i < len(raw) && raw[i] == '}' {
		return nil, skipJSONSpace(raw, i+1) == len(raw)
	}
	for {
		key, escaped, end, ok := scanJSONString(raw, i)
		if !ok || escaped {
			return nil, false
		}
		if i = skipJSONSpace(raw, end); i == len(raw) || raw[i] != ':' {
			return nil, false
		}
		val, escaped, end, ok := scanJSONString(raw, skipJSONSpace(raw, i+1))
		if !ok {
			return nil, false
		}
		ms = append(ms, member{key: key, val: val, escaped: escaped})
		if i = skipJSONSpace(raw, end); i == len(raw) {
			return nil, false
		}
		switch raw[i] {
		case ',':
			i = skipJSONSpace(raw, i+1)
		case '}':
			return ms, skipJSONSpace(raw, i+1) == len(raw)
		default:
			return nil, false
		}
	}
}

// skipJSONSpace is the index of the first byte at or after i that is not
// JSON white space (which, unlike \s, has no form feed).
func skipJSONSpace(raw []byte, i int) int {
	for i < len(raw) && (raw[i] == ' ' || raw[i] == '\t' || raw[i] == '\n' || raw[i] == '\r') {
		i++
	}
	return i
}

// scanJSONString reads the string that opens at raw[i]: its bytes between
// the quotes, whether they hold escapes, and the index after the closing
// quote. ok is false when no string opens there, or when it holds a
// control character or an escape other than \" \\ \/ \b \f \n \r \t.
func scanJSONString(raw []byte, i int) (s []byte, escaped bool, end int, ok bool) {
	if i == len(raw) || raw[i] != '"' {
		return nil, false, 0, false
	}
	for j := i + 1; j < len(raw); j++ {
		switch c := raw[j]; {
		case c == '"':
			return raw[i+1 : j], escaped, j + 1, true
		case c < 0x20:
			return nil, false, 0, false
		case c == '\\':
			if j+1 == len(raw) || jsonEscapes[raw[j+1]] == 0 {
				return nil, false, 0, false
			}
			escaped = true
			j++
		}
	}
	return nil, false, 0, false
}

// jsonEscapes maps the byte after a backslash to the byte it stands for,
// for the escapes scanJSONString takes; 0 for the others.
var jsonEscapes = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

// unescapeJSON decodes a string scanJSONString took with escaped set,
// copying the runs between escapes whole.
func unescapeJSON(s []byte) string {
	var b strings.Builder
	b.Grow(len(s))
	for {
		i := bytes.IndexByte(s, '\\')
		if i < 0 {
			b.Write(s)
			return b.String()
		}
		b.Write(s[:i])
		b.WriteByte(jsonEscapes[s[i+1]])
		s = s[i+2:]
	}
}

// writeTargets appends to out the target word of each shell write in line,
// in order: > file, >> file, tee file, tee -a file, each optionally quoted.
// It stands for the pattern
//
//	(?:>>?|\btee\s+(?:-a\s+)?)\s*['"]?([^\s'";|&<>()]+)
//
// matched leftmost-first and without overlap, written out by hand because
// it runs over every command line of every condensed span.
func writeTargets(line string, out []string) []string {
	for i := 0; i < len(line); {
		var j int // just past the operator
		switch {
		case line[i] == '>':
			j = i + 1
			if j < len(line) && line[j] == '>' {
				j++
			}
		case line[i] == 't' && strings.HasPrefix(line[i+1:], "ee") && (i == 0 || !isWordByte(line[i-1])):
			j = skipSpace(line, i+3)
			if j == i+3 {
				i++ // tee must be followed by white space
				continue
			}
			// -a and its white space belong to the operator only if a
			// target follows them; else "-a" itself is the target word.
			if strings.HasPrefix(line[j:], "-a") {
				if k := skipSpace(line, j+2); k > j+2 {
					if w, end := writeTarget(line, k); end > 0 {
						out = append(out, w)
						i = end
						continue
					}
				}
			}
		default:
			i++
			continue
		}
		if w, end := writeTarget(line, j); end > 0 {
			out = append(out, w)
			i = end
			continue
		}
		i++
	}
	return out
}

// writeTarget reads \s*['"]?([^\s'";|&<>()]+) at line[j:]: the word and
// the index just past it, or end 0 when no word follows. No backtracking is
// needed: neither white space nor a quote can start the word.
func writeTarget(line string, j int) (word string, end int) {
	j = skipSpace(line, j)
	if j < len(line) && (line[j] == '\'' || line[j] == '"') {
		j++
	}
	e := j
	for e < len(line) && !endsTarget[line[e]] {
		e++
	}
	if e == j {
		return "", 0
	}
	return line[j:e], e
}

// endsTarget marks the bytes a write target cannot hold.
var endsTarget = byteSet(" \t\n\f\r'\";|&<>()")

// editsInPlace reports whether cmd runs sed -i (or --in-place), which edits
// the files it names: the pattern \bsed\s+(?:-[a-zA-Z]*i|--in-place),
// scanned by hand because the regexp backtracked at every byte of long
// heredoc commands.
func editsInPlace(cmd string) bool {
	for i := 0; ; {
		k := strings.Index(cmd[i:], "sed")
		if k < 0 {
			return false
		}
		k += i
		i = k + 1
		if k > 0 && isWordByte(cmd[k-1]) {
			continue
		}
		j := skipSpace(cmd, k+3)
		if j == k+3 || j == len(cmd) || cmd[j] != '-' {
			continue
		}
		if strings.HasPrefix(cmd[j:], "--in-place") {
			return true
		}
		// -[a-zA-Z]*i: some letter of the flag cluster is an i.
		for e := j + 1; e < len(cmd) && isLetter(rune(cmd[e])); e++ {
			if cmd[e] == 'i' {
				return true
			}
		}
	}
}

// isWordByte is the regexp \w for one byte: \b at a byte boundary of UTF-8
// text, where a byte of a multi-byte rune is never a word character.
func isWordByte(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_'
}

// isSpaceByte is the regexp \s: ASCII white space without \v.
func isSpaceByte(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\f' || c == '\r'
}

// skipSpace is the index of the first byte at or after i that is not \s.
func skipSpace(s string, i int) int {
	for i < len(s) && isSpaceByte(s[i]) {
		i++
	}
	return i
}

// byteSet marks the bytes of chars, for scanners that test a byte per step.
func byteSet(chars string) (set [256]bool) {
	for i := 0; i < len(chars); i++ {
		set[chars[i]] = true
	}
	return set
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
	return withFilesList(text, FilesTouched(msgs))
}

// withFilesList appends the files-touched section of files to a summary.
func withFilesList(text string, files []FileTouch) string {
	if s := RenderFilesTouched(files); s != "" {
		return strings.TrimRight(text, "\n") + "\n\n" + s
	}
	return text
}

// fileLine reads a line of an earlier list back: "- path (how)", the path
// one or more bytes without white space, as the regexp
// ^- (\S+) \((created|edited|read)\)$ read it.
func fileLine(line string) (FileTouch, bool) {
	rest, ok := strings.CutPrefix(line, "- ")
	if !ok {
		return FileTouch{}, false
	}
	if rest, ok = strings.CutSuffix(rest, ")"); !ok {
		return FileTouch{}, false
	}
	// The action holds no " (", so the last one opens it.
	i := strings.LastIndex(rest, " (")
	if i < 0 {
		return FileTouch{}, false
	}
	p, how := rest[:i], rest[i+2:]
	if how != "created" && how != "edited" && how != "read" || p == "" || strings.ContainsAny(p, " \t\n\f\r") {
		return FileTouch{}, false
	}
	return FileTouch{Path: p, How: how}, true
}

// filesFromList reads the files-touched section of an earlier summary, so a
// second condense carries the first one's files forward.
func filesFromList(summary string) []FileTouch {
	i := strings.Index(summary, FilesTouchedHeading)
	if i < 0 {
		return nil
	}
	var out []FileTouch
	for line := range strings.SplitSeq(summary[i+len(FilesTouchedHeading):], "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "## ") {
			break
		}
		if f, ok := fileLine(line); ok {
			out = append(out, f)
		}
	}
	return out
}

// Error lines. A tool's output reports an error on a line that names one
// (Error, Exception, FAILED, Traceback…) and is not source code that merely
// mentions one (an "except ValueError:" in a listing the agent read).
var (
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
	if !mayReportError(out) {
		return "" // no line can report one: skip the walk over the lines
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
		if !mayReportError(line) || !reportsError(line) {
			continue
		}
		l := collapseSpace(line)
		if l == "" || boilerplateLines[l] || codeLinePattern.MatchString(l) {
			continue
		}
		return clip(l, maxLastErrorChars)
	}
	return ""
}

// mayReportError is a cheap superset of reportsError: most lines hold none
// of its words, and five substring tests beat its word-boundary checks.
func mayReportError(line string) bool {
	return strings.Contains(line, "rror") || strings.Contains(line, "RROR") || strings.Contains(line, "xception") ||
		strings.Contains(line, "Traceback") || strings.Contains(line, "FAILED")
}

// reportsError reports whether line names an error as the pattern
// (?:Error|Exception|exceptions?)\b|\berror\b|\bERROR\b|Traceback|FAILED
// matches it: a class name such as ValueError, or error as a word. It is
// written out because the regexp was the main cost of LastErrorLine.
func reportsError(line string) bool {
	return strings.Contains(line, "Traceback") || strings.Contains(line, "FAILED") ||
		hasWord(line, "Error", false) || hasWord(line, "Exception", false) ||
		hasWord(line, "exception", false) || hasWord(line, "exceptions", false) ||
		hasWord(line, "error", true) || hasWord(line, "ERROR", true)
}

// hasWord reports whether w occurs in s with a word boundary after it (w
// ends in a letter) and, when whole, one before it too.
func hasWord(s, w string, whole bool) bool {
	for i := 0; ; {
		k := strings.Index(s[i:], w)
		if k < 0 {
			return false
		}
		k += i
		if e := k + len(w); (e == len(s) || !isWordByte(s[e])) && (!whole || k == 0 || !isWordByte(s[k-1])) {
			return true
		}
		i = k + 1
	}
}

// collapseSpace is strings.Join(strings.Fields(s), " "): white space runs
// become one space, none at the ends. Text that is already so (most
// commands and error lines) comes back as it is, with no allocation, and
// the rest is built in one buffer instead of a slice of fields and a join.
func collapseSpace(s string) string {
	if isCollapsed(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for f := range strings.FieldsSeq(s) {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(f)
	}
	return b.String()
}

// isCollapsed reports whether collapseSpace(s) is s: no white space but
// single spaces between non-space runes.
func isCollapsed(s string) bool {
	prevSpace := true // a leading space is not collapsed
	for _, r := range s {
		switch {
		case r == ' ':
			if prevSpace {
				return false
			}
			prevSpace = true
		case unicode.IsSpace(r):
			return false
		default:
			prevSpace = false
		}
	}
	return !prevSpace || s == ""
}
