package llm

import (
	"context"
	"fmt"
	"path"
	"sort"
	"strings"

	"github.com/ctxpipe/ctxpipe/prompts"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/textfacts"
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
	text := textfacts.Clip(body, limit-len([]rune(tail))-2) + "\n\n" + tail
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
				b.WriteString("`" + textfacts.Clip(e.call, 80) + "`: ")
			}
			b.WriteString(e.line)
		}
		text = b.String()
	}
	return schema.Summary{Text: textfacts.WithFileList(text, f.touched.List()), Model: OfflineModel}, nil
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
	touched textfacts.Touched
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
			f.touched.Carry(f.earlier)
			continue
		}
		if m.IsTruncationMarker {
			// FilesTouched reads a marker's list and its tool calls (it
			// has none in practice); the facts leave the marker out.
			f.touched.Carry(userText(m.Content))
			for _, b := range m.Content.BlocksOf() {
				if b.Type == schema.BlockToolUse {
					f.touched.Call(b, textfacts.ReadToolInput(b.Input))
				}
			}
			continue
		}
		for _, b := range m.Content.BlocksOf() {
			switch b.Type {
			case schema.BlockToolUse:
				in := textfacts.ReadToolInput(b.Input)
				f.toolUse(b, in)
				f.touched.Call(b, in)
			case schema.BlockToolResult:
				body := "" // rendered once for both readers
				if b.Content != nil {
					body = RenderContent(*b.Content)
				}
				if b.IsError {
					f.toolError(b, body)
				}
				if b.Content != nil {
					if l := textfacts.LastErrorLine(body); l != "" {
						f.lastErrors = append(f.lastErrors, callError{call: f.calls[b.ToolUseID], line: l})
					}
				}
			case schema.BlockText:
				if m.Role == schema.RoleAssistant {
					if n := excerpt(b.Text, maxNoteChars); n != "" {
						f.notes = append(f.notes, n)
						f.lastNote = textfacts.Head(b.Text, 4*budgetCurrent)
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
			if p = strings.Trim(p, "`"); textfacts.LooksLikePath(p) {
				out = append(out, p)
			}
		}
	}
	return out
}

func (f *facts) toolUse(b schema.Block, in textfacts.ToolInput) {
	f.toolCalls++
	name := b.Name
	if name == "" {
		name = "tool"
	}
	f.tools[name]++
	for _, p := range in.Paths {
		if p = textfacts.ExplicitPath(p); p != "" {
			f.note(f.files, p)
		}
	}
	line, paths := textfacts.CallLine(b, in)
	for _, p := range paths {
		f.note(f.files, p)
	}
	f.note(f.commands, line)
	f.lastCommand = line
	if b.ID != "" {
		f.calls[b.ID] = line
	}
}

// toolError records a failed tool result; body is its rendered content.
func (f *facts) toolError(b schema.Block, body string) {
	f.failed++
	f.errors = append(f.errors, textfacts.Clip(f.who(b.ToolUseID)+": "+textfacts.FailureLine(body), maxErrorChars))
}

// who names a call in the errors list: its id and its command.
func (f *facts) who(id string) string {
	if cmd := f.calls[id]; cmd != "" {
		return id + " (`" + textfacts.Clip(cmd, 50) + "`)"
	}
	return id
}

// excerpt is a note's first sentence or line, whitespace collapsed.
func excerpt(s string, n int) string {
	s = textfacts.Head(s, 8*n) // no need to scan a long message past its start
	s = textfacts.CollapseSpace(s)
	if i := sentenceEnd(s); i > 0 {
		s = s[:i]
	}
	return textfacts.Clip(s, n)
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
		b.WriteString(quote(textfacts.CollapseSpace(f.lastNote), budgetCurrent))
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
		if e := path.Ext(p); e != "" && textfacts.KnownExt(e[1:]) {
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
	s = textfacts.Clip(strings.TrimSpace(s), n)
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
