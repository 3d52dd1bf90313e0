package llm

import (
	"bytes"
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

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

// maxFilesTouchedChars bounds the list in a summary, so a span that lists
// a whole tree cannot make the summary grow without limit.
const maxFilesTouchedChars = 6_000

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
	var t touchList
	for i, m := range msgs {
		if i == len(msgs)-1 && m.Role == schema.RoleUser && prompts.IsFinalInstruction(userText(m.Content)) {
			break
		}
		if m.IsCondenseSummary() {
			t.carry(summaryText(m.Content))
			continue
		}
		if m.IsTruncationMarker {
			t.carry(userText(m.Content))
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
	at  map[string]int // path (a group's with "**") → index in out
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

func (t *touchList) add(p, how string) { t.addEntry(FileTouch{Path: p, How: how}) }

// addEntry adds a file, or a group whose count adds to an equal one's.
func (t *touchList) addEntry(f FileTouch) {
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

// carry adds the lists of an earlier summary's or a marker's text.
func (t *touchList) carry(text string) {
	for _, f := range filesFromList(text) {
		t.addEntry(f)
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
		for lines := (commandLines{rest: c.text}); ; {
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

// commandLines walks the lines of a shell command that the shell reads as
// commands. The body of a here document (the lines after the line that
// opens it with <<WORD or <<-WORD, up to its closing line WORD) is the
// contents of a file, not commands: it is skipped, and the lines after the
// closing line are read again. A body that never closes runs to the end.
type commandLines struct {
	rest string
	done bool
}

// next is the next command line, and false after the last.
func (c *commandLines) next() (string, bool) {
	if c.done {
		return "", false
	}
	line, more, found := strings.Cut(c.rest, "\n")
	if !found {
		c.done = true
		return line, true
	}
	c.rest = more
	if strings.Contains(line, "<<") {
		var closed bool
		c.rest, closed = skipHereDocs(line, c.rest)
		c.done = !closed
	}
	return line, true
}

// skipHereDocs skips, in rest (the text after line), the bodies of the here
// documents line opens, in order, each up to its closing line. closed is
// false when no line follows the last body.
func skipHereDocs(line, rest string) (after string, closed bool) {
	for i := 0; ; {
		delim, strip, end, ok := nextHereDoc(line, i)
		if end < 0 {
			return rest, true
		}
		i = end
		if !ok {
			continue
		}
		for {
			l, more, found := strings.Cut(rest, "\n")
			if strip {
				l = strings.TrimLeft(l, "\t")
			}
			if !found {
				return "", false // closed on the last line or not at all: nothing follows
			}
			rest = more
			if l == delim {
				break
			}
		}
	}
}

// nextHereDoc finds the first << at or after line[i:] and reads the here
// document it opens: the pattern <<(-?)[ \t]*(WORD)? where WORD is made of
// '…', "…", a backslash and the character after it, and characters other
// than white space, quotes, backslashes and ;|&<>(). end is the index past
// the match, -1 when there is no <<. ok is false when the match opens no
// here document: no word follows, or a < stands right before or after the
// << (a here-string <<<, or a run of them). delim is the word without its
// quotes and backslashes, as the closing line spells it; strip reports
// <<-, whose closing line may be indented with tabs.
func nextHereDoc(line string, i int) (delim string, strip bool, end int, ok bool) {
	k := strings.Index(line[i:], "<<")
	if k < 0 {
		return "", false, -1, false
	}
	k += i
	j := k + 2
	if j < len(line) && line[j] == '-' {
		strip = true
		j++
	}
	for j < len(line) && (line[j] == ' ' || line[j] == '\t') {
		j++
	}
	var b strings.Builder
	start := j
	for j < len(line) {
		c := line[j]
		if c == '\'' || c == '"' {
			e := strings.IndexByte(line[j+1:], c)
			if e < 0 {
				break // an unclosed quote ends the word before it
			}
			b.WriteString(line[j+1 : j+1+e])
			j += e + 2
			continue
		}
		if c == '\\' {
			if j+1 == len(line) || line[j+1] == '\n' {
				break
			}
			_, size := utf8.DecodeRuneInString(line[j+1:])
			b.WriteString(line[j+1 : j+1+size])
			j += 1 + size
			continue
		}
		if endsHereWord[c] {
			break
		}
		b.WriteByte(c)
		j++
	}
	ok = j > start && (k == 0 || line[k-1] != '<') && (k+2 == len(line) || line[k+2] != '<')
	return b.String(), strip, j, ok
}

// endsHereWord marks the bytes that end a here document's word outside
// quotes: the regexp class [\s;|&<>()].
var endsHereWord = byteSet(" \t\n\f\r;|&<>()")

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
