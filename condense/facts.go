package condense

import (
	"sort"
	"strings"

	"github.com/ctxpipe/ctxpipe/prompts"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/textfacts"
)

// Bounds in characters on one item of the summary's lists.
const (
	maxErrorChars = 160
	maxNoteChars  = 180
)

// callError is a tool result's last error line and the call it answered.
type callError struct{ call, line string }

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
