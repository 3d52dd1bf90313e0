package llm

import (
	"context"
	"fmt"
	"path"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ctxpipe/ctxpipe/prompts"
	"github.com/ctxpipe/ctxpipe/schema"
)

// OfflineModel is the Summary.Model of the offline condenser.
const OfflineModel = "offline-extractive"

// DefaultOfflineMaxChars bounds an offline summary, whatever the input size,
// so that condensing a long conversation really shrinks it.
const DefaultOfflineMaxChars = 4000

// Per-section budgets in characters. With the headings they add up to about
// DefaultOfflineMaxChars, so the final cut seldom bites; when it does, it
// cuts the middle and keeps the last section (the latest request, the most
// important for carrying on) whole.
const (
	budgetTask     = 450
	budgetEarlier  = 300
	budgetCurrent  = 300
	budgetConcepts = 150
	budgetFiles    = 400
	budgetCommands = 600
	budgetErrors   = 450
	budgetNotes    = 250
	budgetLatest   = 650

	maxCommandChars = 140
	maxErrorChars   = 160
	maxNoteChars    = 180
)

// Offline is a deterministic extractive condenser: it needs no network and
// quotes the conversation instead of paraphrasing it. It writes the same six
// headings as the Detailed prompt: the task as first stated, the latest
// assistant note and command, the tools and file types used, the files
// touched (from tool inputs and commands), the commands run, the errors seen
// and short assistant notes, and the latest user request verbatim. The same
// messages always give the same bytes. The zero value is ready to use.
type Offline struct {
	// MaxChars bounds the summary; 0 means DefaultOfflineMaxChars.
	MaxChars int
}

// Summarize condenses req.Messages. The final instruction turn the engine
// appends is recognized (prompts.IsFinalInstruction) and ignored. The prompt
// is not used: there is no model to follow it.
func (o *Offline) Summarize(ctx context.Context, req schema.SummaryRequest) (schema.Summary, error) {
	if err := ctx.Err(); err != nil {
		return schema.Summary{}, fmt.Errorf("offline summarize: %w", err)
	}
	limit := o.MaxChars
	if limit <= 0 {
		limit = DefaultOfflineMaxChars
	}
	f := extract(source(req))
	body, tail := f.render()
	text := clip(body, limit-len([]rune(tail))-2) + "\n\n" + tail
	// Outside the bound: the last error line and the files touched are
	// what an agent most needs verbatim, and each is bounded on its own.
	if errs := lastDistinct(f.lastErrors, lastErrorsShown); len(errs) > 0 {
		// One buffer: appending to text copied the whole summary per piece.
		var b strings.Builder
		b.WriteString(text)
		b.WriteString("\n\n## Last errors seen (verbatim, most recent last)")
		for _, e := range errs {
			b.WriteString("\n- ")
			if e.call != "" {
				b.WriteString("`" + clip(e.call, 80) + "`: ")
			}
			b.WriteString(e.line)
		}
		text = b.String()
	}
	return schema.Summary{Text: withFilesList(text, f.touched.out), Model: OfflineModel}, nil
}

// source is the request's span with tool blocks intact.
func source(req schema.SummaryRequest) []schema.Message {
	if req.Source != nil {
		return req.Source
	}
	return req.Messages
}

// callError is a tool result's last error line and the call it answered.
type callError struct{ call, line string }

// lastErrorsShown is how many results' last error lines a summary quotes:
// the span's last results may be context the engine added (the results of
// its last calls, kept whole after it), so one line is not enough.
const lastErrorsShown = 3

// lastDistinct is the last n entries of errs with distinct lines, in order.
func lastDistinct(errs []callError, n int) []callError {
	var out []callError
	seen := map[string]bool{}
	for i := len(errs) - 1; i >= 0 && len(out) < n; i-- {
		if !seen[errs[i].line] {
			seen[errs[i].line] = true
			out = append(out, errs[i])
		}
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

// facts is what the offline condenser pulls out of a conversation.
type facts struct {
	messages, toolCalls, failed int
	task                        string // the first user text, not a summary
	earlier                     string // the latest earlier summary's text
	latest                      string // the last user text
	notes                       []string
	lastNote                    string
	tools                       map[string]int
	files                       map[string]*seen
	commands                    map[string]*seen
	lastCommand                 string
	errors                      []string
	calls                       map[string]string // tool_use id → short description
	order                       int
	// lastErrors are the last error line of each tool result that had one,
	// verbatim, with the call it answered.
	lastErrors []callError
	// touched is FilesTouched of the same messages, built in this pass so
	// that each tool input is decoded and scanned once.
	touched touchList
}

// seen counts occurrences and remembers the first and last position, for
// stable, deterministic ordering.
type seen struct {
	key         string
	count       int
	first, last int
}

func (f *facts) note(m map[string]*seen, key string) {
	f.order++
	s := m[key]
	if s == nil {
		s = &seen{key: key, first: f.order}
		m[key] = s
	}
	s.count++
	s.last = f.order
}

func extract(msgs []schema.Message) *facts {
	f := &facts{
		tools: map[string]int{}, files: map[string]*seen{}, commands: map[string]*seen{},
		calls: map[string]string{},
	}
	for i, m := range msgs {
		if i == len(msgs)-1 && m.Role == schema.RoleUser && prompts.IsFinalInstruction(userText(m.Content)) {
			break // the engine's trigger turn, not the user's words
		}
		if m.IsSummaryAck {
			continue // ctxpipe's words after a summary, not the agents'
		}
		f.messages++
		if m.IsCondenseSummary() {
			f.earlier = summaryText(m.Content)
			for _, p := range filesFromSummary(f.earlier) {
				f.note(f.files, p)
			}
			f.touched.carry(f.earlier)
			continue
		}
		if m.IsTruncationMarker {
			// FilesTouched reads a marker's list and its tool calls (it
			// has none in practice); the facts leave the marker out.
			f.touched.carry(userText(m.Content))
			for _, b := range m.Content.BlocksOf() {
				if b.Type == schema.BlockToolUse {
					f.touched.call(b, readToolInput(b.Input))
				}
			}
			continue
		}
		for _, b := range m.Content.BlocksOf() {
			switch b.Type {
			case schema.BlockToolUse:
				in := readToolInput(b.Input)
				f.toolUse(b, in)
				f.touched.call(b, in)
			case schema.BlockToolResult:
				body := "" // rendered once for both readers
				if b.Content != nil {
					body = RenderContent(*b.Content)
				}
				if b.IsError {
					f.toolError(b, body)
				}
				if b.Content != nil {
					if l := LastErrorLine(body); l != "" {
						f.lastErrors = append(f.lastErrors, callError{call: f.calls[b.ToolUseID], line: l})
					}
				}
			case schema.BlockText:
				if m.Role == schema.RoleAssistant {
					if n := excerpt(b.Text, maxNoteChars); n != "" {
						f.notes = append(f.notes, n)
						f.lastNote = head(b.Text, 4*budgetCurrent)
					}
				}
			}
		}
		if m.Role == schema.RoleUser {
			if t := strings.TrimSpace(userText(m.Content)); t != "" && !prompts.IsFinalInstruction(t) {
				if f.task == "" {
					f.task = t
				}
				f.latest = t
			}
		}
	}
	return f
}

// userText joins a message's text blocks, leaving out tool results.
func userText(c schema.Content) string { return c.OwnText("\n\n") }

// summaryText is an earlier summary's text, without its synthetic reasoning.
func summaryText(c schema.Content) string { return strings.TrimSpace(userText(c)) }

// filesFromSummary carries the file list of an earlier offline summary
// forward, so repeated condensing does not forget the files.
func filesFromSummary(s string) []string {
	head := "## " + prompts.DetailedSections[3]
	i := strings.Index(s, head)
	if i < 0 {
		return nil
	}
	rest := s[i+len(head):]
	if j := strings.Index(rest, "\n## "); j >= 0 {
		rest = rest[:j]
	}
	var out []string
	for _, line := range strings.Split(rest, "\n") {
		if p, ok := strings.CutPrefix(strings.TrimSpace(line), "- "); ok {
			if p = strings.Trim(p, "`"); looksLikePath(p) {
				out = append(out, p)
			}
		}
	}
	return out
}

// Keys of tool inputs that name files directly.
var pathKeys = []string{"path", "file_path", "filepath", "filename", "file_name", "file", "target_file",
	"notebook_path", "paths", "files", "dir", "directory", "dir_path"}

// Keys of tool inputs that hold a shell command.
var commandKeys = []string{"command", "cmd", "script"}

func (f *facts) toolUse(b schema.Block, in toolInput) {
	f.toolCalls++
	name := b.Name
	if name == "" {
		name = "tool"
	}
	f.tools[name]++
	for _, p := range in.paths {
		if p = explicitPath(p); p != "" {
			f.note(f.files, p)
		}
	}
	line := ""
	if len(in.commands) > 0 {
		// The first command key that holds any command, its strings joined.
		first := in.commands[0]
		n := 1
		for n < len(in.commands) && in.commands[n].key == first.key {
			n++
		}
		cmd, paths := first.text, first.paths
		if n > 1 {
			texts := make([]string, n)
			for i, c := range in.commands[:n] {
				texts[i] = c.text
			}
			cmd = strings.Join(texts, " ")
			paths = pathsInCommand(cmd)
		}
		for _, p := range paths {
			f.note(f.files, p)
		}
		line = commandLine(cmd)
	}
	if line == "" {
		raw := collapseSpace(string(b.Input))
		if raw == "" || raw == "{}" || raw == "null" {
			line = name
		} else {
			line = clip(name+" "+raw, maxCommandChars)
		}
	}
	f.note(f.commands, line)
	f.lastCommand = line
	if b.ID != "" {
		f.calls[b.ID] = line
	}
}

// findReturnCode finds the leftmost <returncode>\s*(-?\d+)\s*</returncode>
// in s: the code, the whole element, and whether there is one. It is
// written out because it runs on every failed tool result.
func findReturnCode(s string) (code, elem string, ok bool) {
	const open, closing = "<returncode>", "</returncode>"
	for from := 0; ; {
		i := strings.Index(s[from:], open)
		if i < 0 {
			return "", "", false
		}
		i += from
		from = i + 1
		j := skipSpace(s, i+len(open))
		start := j
		if j < len(s) && s[j] == '-' {
			j++
		}
		d := j
		for j < len(s) && s[j] >= '0' && s[j] <= '9' {
			j++
		}
		if j == d {
			continue
		}
		end := skipSpace(s, j)
		if strings.HasPrefix(s[end:], closing) {
			return s[start:j], s[i : end+len(closing)], true
		}
	}
}

// toolError records a failed tool result; body is its rendered content.
func (f *facts) toolError(b schema.Block, body string) {
	f.failed++
	if strings.HasPrefix(body, MaskedPrefix) {
		// A masked stand-in: its kept error line, if any, is the failure.
		first := "(output masked)"
		if l := LastErrorLine(body); l != "" {
			first = l
		}
		f.errors = append(f.errors, clip(f.who(b.ToolUseID)+": "+first, maxErrorChars))
		return
	}
	prefix := ""
	if code, elem, ok := findReturnCode(head(body, 256)); ok {
		prefix = "exit " + code + ": "
		body = strings.Replace(body, elem, "", 1)
	}
	first := "(no output)"
	if lines := meaningfulLines(head(body, 8<<10)); len(lines) > 0 {
		first = lines[0]
		// A Python traceback's first line says nothing; its last names the exception.
		if strings.HasPrefix(first, "Traceback (most recent call last)") {
			if end := meaningfulLines(tail(body, 8<<10)); len(end) > 0 {
				first = end[len(end)-1]
			}
		}
	}
	f.errors = append(f.errors, clip(f.who(b.ToolUseID)+": "+prefix+first, maxErrorChars))
}

// who names a call in the errors list: its id and its command.
func (f *facts) who(id string) string {
	if cmd := f.calls[id]; cmd != "" {
		return id + " (`" + clip(cmd, 50) + "`)"
	}
	return id
}

// meaningfulLines are the non-blank lines of s with XML-ish tags removed.
func meaningfulLines(s string) []string {
	var out []string
	for line := range strings.SplitSeq(s, "\n") {
		if l := strings.TrimSpace(stripTags(line)); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// maxTagRunes bounds what stripTags takes for a tag: <name attr="…">, not
// a comparison such as a < b > c across a line.
const maxTagRunes = 40

// stripTags removes what the regexp <[^<>\n]{1,40}> matches: a < and a >
// with 1 to 40 runes between them, none of them <, > or a newline. It
// allocates only when it removes something; most lines hold no tag.
func stripTags(line string) string {
	i := strings.IndexByte(line, '<')
	if i < 0 {
		return line
	}
	var b strings.Builder
	kept := 0 // line[kept:i] is not yet copied
	for i >= 0 {
		j, runes := i+1, 0
		for j < len(line) && line[j] != '<' && line[j] != '>' && line[j] != '\n' && runes <= maxTagRunes {
			_, size := utf8.DecodeRuneInString(line[j:]) // an invalid byte counts as one rune, as in regexp
			j += size
			runes++
		}
		next := i + 1
		if j < len(line) && line[j] == '>' && runes >= 1 && runes <= maxTagRunes {
			b.WriteString(line[kept:i])
			kept, next = j+1, j+1
		}
		if k := strings.IndexByte(line[next:], '<'); k >= 0 {
			i = next + k
		} else {
			i = -1
		}
	}
	if kept == 0 {
		return line
	}
	b.WriteString(line[kept:])
	return b.String()
}

// tail is at most the last n bytes of s, cut at a rune boundary.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := len(s) - n
	for i < len(s) && !utf8.RuneStart(s[i]) {
		i++
	}
	return s[i:]
}

// stringsOf returns v as a list of strings: a string, or the strings in an array.
func stringsOf(v any) []string {
	switch t := v.(type) {
	case string:
		if strings.TrimSpace(t) != "" {
			return []string{t}
		}
	case []any:
		var out []string
		for _, e := range t {
			if s, ok := e.(string); ok && strings.TrimSpace(s) != "" {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}

// commandLine is a command's first line, marked when more lines follow.
func commandLine(cmd string) string {
	cmd = strings.TrimSpace(cmd)
	first, rest, more := strings.Cut(cmd, "\n")
	first = collapseSpace(first)
	if more && strings.TrimSpace(rest) != "" {
		first += " …"
	}
	return clip(first, maxCommandChars)
}

// splitsWords marks the bytes that separate shell words: white space,
// quotes and operators, which is crude but enough to find path-like words.
// They are the class [\s;|&<>()'"`=,{}\[\]$] of the regexp this replaced.
var splitsWords = byteSet(" \t\n\f\r;|&<>()'\"`=,{}[]$")

// pathsInCommand finds the words of a shell command that look like file
// paths, on its command lines (commandLines: here-document bodies are file
// contents, not paths). It scans bytes by hand: it runs on every command of
// every condensed span.
func pathsInCommand(cmd string) []string {
	var out []string
	for lines := (commandLines{rest: cmd}); ; {
		line, ok := lines.next()
		if !ok {
			break
		}
		for i := 0; i < len(line); {
			if splitsWords[line[i]] {
				i++
				continue
			}
			j := i + 1
			for j < len(line) && !splitsWords[line[j]] {
				j++
			}
			if p := cleanPath(line[i:j]); p != "" {
				out = append(out, p)
			}
			i = j
		}
	}
	return out
}

// cleanPath normalizes a candidate path, returning "" when it is not one.
// A pytest node id (tests/test_a.py::TestX::test_y) names its file.
func cleanPath(w string) string {
	if i := strings.Index(w, "::"); i > 0 {
		w = w[:i]
	}
	w = strings.TrimSpace(w)
	w = strings.TrimRight(w, ".:")
	w = trimLineSuffix(w)
	w = strings.TrimPrefix(w, "./")
	if !looksLikePath(w) {
		return ""
	}
	return w
}

// trimLineSuffix removes a trailing :line[:col…][:] as in a.go:12:3:, the
// regexp (:\d+)+:?$ written out.
func trimLineSuffix(w string) string {
	t := strings.TrimSuffix(w, ":")
	cut := -1
	for end := len(t); ; {
		k := end
		for k > 0 && t[k-1] >= '0' && t[k-1] <= '9' {
			k--
		}
		if k == end || k == 0 || t[k-1] != ':' {
			break
		}
		end = k - 1
		cut = end
	}
	if cut < 0 {
		return w
	}
	return w[:cut]
}

// explicitPath accepts the value of a key that names a file or directory,
// which needs no extension or slash to count as one.
func explicitPath(p string) string {
	p = strings.TrimPrefix(strings.TrimSpace(p), "./")
	if p == "" || p == "." || len(p) > 200 || strings.HasPrefix(p, "-") || !onlyPathChars(p) {
		return ""
	}
	return p
}

// pathChars marks the bytes a path may hold: [A-Za-z0-9_./~+@-].
var pathChars = byteSet("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./~+@-")

// onlyPathChars reports whether w is one or more path bytes.
func onlyPathChars(w string) bool {
	for i := 0; i < len(w); i++ {
		if !pathChars[w[i]] {
			return false
		}
	}
	return w != ""
}

// isSedScript reports whether w is a sed expression such as s/old/new/g or
// y/abc/xyz/: the regexp ^[sy]/[^/]*/[^/]*/[a-zA-Z0-9]*$ written out.
func isSedScript(w string) bool {
	if len(w) < 2 || w[0] != 's' && w[0] != 'y' || w[1] != '/' {
		return false
	}
	rest := w[2:]
	for range 2 {
		i := strings.IndexByte(rest, '/')
		if i < 0 {
			return false
		}
		rest = rest[i+1:]
	}
	for i := 0; i < len(rest); i++ {
		if c := rest[i]; !isLetter(rune(c)) && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// Extensions that make a bare name (no slash) count as a file.
var fileExts = map[string]bool{
	"py": true, "pyi": true, "go": true, "js": true, "mjs": true, "ts": true, "tsx": true, "jsx": true,
	"rs": true, "c": true, "h": true, "cc": true, "cpp": true, "hpp": true, "java": true, "kt": true,
	"rb": true, "php": true, "cs": true, "swift": true, "scala": true, "sh": true, "bash": true,
	"md": true, "rst": true, "txt": true, "json": true, "jsonl": true, "yaml": true, "yml": true,
	"toml": true, "cfg": true, "ini": true, "conf": true, "sql": true, "html": true, "css": true,
	"xml": true, "lock": true, "mod": true, "sum": true, "proto": true, "patch": true, "diff": true,
	"log": true, "csv": true, "ipynb": true, "vue": true, "svelte": true,
}

// looksLikePath accepts words such as src/x.py, /testbed/pkg/, ./a/b and
// setup.cfg, and rejects flags, URLs, numbers, device files and dotted
// identifiers such as os.path.
func looksLikePath(w string) bool {
	if len(w) < 2 || len(w) > 200 || strings.HasPrefix(w, "-") || strings.Contains(w, "://") ||
		!onlyPathChars(w) {
		return false
	}
	for _, skip := range []string{"/dev/", "/proc/", "/sys/"} {
		if strings.HasPrefix(w, skip) || w == skip[:len(skip)-1] {
			return false
		}
	}
	if w == ".." || w == "~" || strings.Trim(w, "./") == "" {
		return false
	}
	if isSedScript(w) {
		return false // s/old/new/g is a sed expression, not a directory
	}
	if ext := strings.TrimPrefix(path.Ext(w), "."); fileExts[ext] {
		base := strings.TrimSuffix(path.Base(w), "."+ext)
		return base != "" && !isNumber(base)
	}
	if !strings.Contains(w, "/") {
		return false
	}
	if strings.HasPrefix(w, "/") || strings.HasPrefix(w, "~/") || strings.HasPrefix(w, "../") {
		return strings.IndexFunc(w, isLetter) >= 0
	}
	// A relative path with no known extension: every segment must start like
	// a name, so arithmetic such as x/2 is not taken for a path.
	for _, seg := range strings.Split(strings.TrimSuffix(w, "/"), "/") {
		if seg == "" || !(isLetter(rune(seg[0])) || seg[0] == '_' || seg[0] == '.') {
			return false
		}
	}
	return true
}

func isLetter(r rune) bool { return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' }

// isNumber reports whether strconv.ParseFloat accepts s. A float starts,
// after its sign, with a digit, a dot, or the i or n of inf and nan; any
// other start is answered at once, which spares ParseFloat the error it
// would allocate for each ordinary file name.
func isNumber(s string) bool {
	t := s
	if t != "" && (t[0] == '+' || t[0] == '-') {
		t = t[1:]
	}
	if t == "" {
		return false
	}
	switch t[0] {
	case '0', '1', '2', '3', '4', '5', '6', '7', '8', '9', '.', 'i', 'I', 'n', 'N':
		_, err := strconv.ParseFloat(s, 64)
		return err == nil
	}
	return false
}

// excerpt is a note's first sentence or line, whitespace collapsed.
func excerpt(s string, n int) string {
	s = head(s, 8*n) // no need to scan a long message past its start
	s = collapseSpace(s)
	if i := sentenceEnd(s); i > 0 {
		s = s[:i]
	}
	return clip(s, n)
}

// head is at most the first n bytes of s, cut at a rune boundary.
func head(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func sentenceEnd(s string) int {
	for i := 0; i+1 < len(s); i++ {
		if (s[i] == '.' || s[i] == '!' || s[i] == '?' || s[i] == ':') && s[i+1] == ' ' && i > 20 {
			return i + 1
		}
	}
	return -1
}

// render writes the summary under the Detailed prompt's headings: the body
// holds sections 1 to 5, the tail section 6.
func (f *facts) render() (body, tail string) {
	var b strings.Builder
	sec := prompts.DetailedSections
	fmt.Fprintf(&b, "Offline extractive summary of %d messages (%d tool calls, %d failed). "+
		"Every line below is quoted or counted from the conversation; no model wrote it.\n", f.messages, f.toolCalls, f.failed)

	fmt.Fprintf(&b, "\n## %s\n", sec[0])
	if f.task != "" {
		b.WriteString("Task as first stated:\n")
		b.WriteString(quote(f.task, budgetTask))
	} else {
		b.WriteString("No user request in the condensed part.\n")
	}
	if f.earlier != "" {
		b.WriteString("Earlier summary (start):\n")
		b.WriteString(quote(f.earlier, budgetEarlier))
	}

	fmt.Fprintf(&b, "\n## %s\n", sec[1])
	if f.lastNote == "" && f.lastCommand == "" {
		b.WriteString("None.\n")
	}
	if f.lastNote != "" {
		b.WriteString("Latest assistant note:\n")
		b.WriteString(quote(collapseSpace(f.lastNote), budgetCurrent))
	}
	if f.lastCommand != "" {
		fmt.Fprintf(&b, "Last command: `%s`\n", f.lastCommand)
	}

	fmt.Fprintf(&b, "\n## %s\n", sec[2])
	concepts := []string{}
	if len(f.tools) > 0 {
		concepts = append(concepts, "Tools used: "+counted(f.tools, 6))
	}
	exts := map[string]int{}
	for p := range f.files {
		if e := path.Ext(p); e != "" && fileExts[e[1:]] {
			exts[e]++
		}
	}
	if len(exts) > 0 {
		concepts = append(concepts, "File types: "+counted(exts, 6))
	}
	writeList(&b, concepts, len(concepts), budgetConcepts, "")

	fmt.Fprintf(&b, "\n## %s\n", sec[3])
	files := ranked(f.files, byCount)
	writeList(&b, files, len(files), budgetFiles, "")

	fmt.Fprintf(&b, "\n## %s\n", sec[4])
	cmds := ranked(f.commands, byLast)
	if len(cmds) > 0 {
		fmt.Fprintf(&b, "Commands run (%d distinct, most recent last):\n", len(cmds))
		writeTail(&b, cmds, budgetCommands, "`")
	}
	if len(f.errors) > 0 {
		fmt.Fprintf(&b, "Errors seen (%d, most recent last):\n", len(f.errors))
		writeTail(&b, f.errors, budgetErrors, "")
	}
	notes := dedupe(f.notes)
	if len(notes) > 0 {
		b.WriteString("Notes from the assistant (most recent last):\n")
		writeTail(&b, notes, budgetNotes, "")
	}
	if len(cmds) == 0 && len(f.errors) == 0 && len(notes) == 0 {
		b.WriteString("None.\n")
	}

	body = strings.TrimRight(b.String(), "\n")
	b.Reset()
	fmt.Fprintf(&b, "## %s\n", sec[5])
	switch {
	case f.latest == "":
		b.WriteString("None.\n")
	case f.latest == f.task:
		b.WriteString("Latest user request: the task quoted in section 1, unchanged since.\n")
	default:
		b.WriteString("Latest user request (verbatim):\n")
		b.WriteString(quote(f.latest, budgetLatest))
	}
	return body, strings.TrimRight(b.String(), "\n")
}

// quote writes s as a Markdown quote of at most n characters.
func quote(s string, n int) string {
	s = clip(strings.TrimSpace(s), n)
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		b.WriteString("> ")
		b.WriteString(strings.TrimRight(line, " \t\r"))
		b.WriteByte('\n')
	}
	return b.String()
}

// writeList writes items as bullets from the start until the budget is
// spent, then says how many were left out.
func writeList(b *strings.Builder, items []string, total, budget int, wrap string) {
	if len(items) == 0 {
		b.WriteString("None.\n")
		return
	}
	used, shown := 0, 0
	for _, it := range items {
		line := "- " + wrap + it + wrap + "\n"
		if used+len(line) > budget && shown > 0 {
			break
		}
		b.WriteString(line)
		used += len(line)
		shown++
	}
	if shown < total {
		fmt.Fprintf(b, "- … and %d more\n", total-shown)
	}
}

// writeTail writes the last items that fit the budget, oldest first.
func writeTail(b *strings.Builder, items []string, budget int, wrap string) {
	used, start := 0, len(items)
	for start > 0 {
		line := "- " + wrap + items[start-1] + wrap + "\n"
		if used+len(line) > budget && start < len(items) {
			break
		}
		used += len(line)
		start--
	}
	if start > 0 {
		fmt.Fprintf(b, "- … %d earlier not shown\n", start)
	}
	for _, it := range items[start:] {
		b.WriteString("- " + wrap + it + wrap + "\n")
	}
}

type rankOrder int

const (
	byCount rankOrder = iota // most frequent first, then first seen
	byLast                   // least recently seen first, so the newest is last
)

func ranked(m map[string]*seen, order rankOrder) []string {
	all := make([]*seen, 0, len(m))
	for _, s := range m {
		all = append(all, s)
	}
	sort.Slice(all, func(i, j int) bool {
		a, c := all[i], all[j]
		if order == byLast {
			return a.last < c.last
		}
		if a.count != c.count {
			return a.count > c.count
		}
		return a.first < c.first
	})
	out := make([]string, len(all))
	for i, s := range all {
		out[i] = s.key
	}
	return out
}

// counted renders "a (3), b (1)": the n most frequent, ties by name.
func counted(m map[string]int, n int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if m[keys[i]] != m[keys[j]] {
			return m[keys[i]] > m[keys[j]]
		}
		return keys[i] < keys[j]
	})
	parts := make([]string, 0, n)
	for i, k := range keys {
		if i == n {
			parts = append(parts, fmt.Sprintf("%d more", len(keys)-n))
			break
		}
		parts = append(parts, fmt.Sprintf("%s (%d)", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// dedupe keeps the last occurrence of each string, in order.
func dedupe(items []string) []string {
	last := map[string]int{}
	for i, s := range items {
		last[s] = i
	}
	out := make([]string, 0, len(last))
	for i, s := range items {
		if last[s] == i {
			out = append(out, s)
		}
	}
	return out
}
