package quality

import (
	"bytes"
	"slices"
	"strings"

	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/textfacts"
)

// Count is how many facts of one kind a hidden span held and how many of
// them the effective history still holds after the reduction.
type Count struct {
	Total int `json:"total"`
	Kept  int `json:"kept"`
}

// Share is Kept/Total, and false when the span held none.
func (c Count) Share() (float64, bool) {
	if c.Total == 0 {
		return 0, false
	}
	return float64(c.Kept) / float64(c.Total), true
}

// Reduction is what one reduction kept: one turn at which the engine made
// the context smaller (a condense, a truncation, a masking, or several of
// them for the same turn). Each is one break of the agent's prompt cache.
type Reduction struct {
	Transcript string   `json:"transcript"`
	Turn       int      `json:"turn"`   // index of the turn that caused it
	Events     []string `json:"events"` // its reduction events, in order
	// TokensBefore and TokensAfter are the context (system prompt plus
	// effective history, by the engine's own counts) before and after.
	TokensBefore int `json:"tokens_before"`
	TokensAfter  int `json:"tokens_after"`
	// Hidden is the number of messages in the hidden span.
	Hidden int `json:"hidden"`
	// Files are the files the span's tool calls name (FilesInInput), kept
	// when the effective history names them or lists them (a summary's or
	// a marker's files-touched list, a group there included).
	Files Count `json:"files"`
	// FilesLost are the files the effective history no longer names.
	FilesLost []string `json:"files_lost,omitempty"`
	Paths     Count    `json:"paths"`
	Errors    Count    `json:"errors"`
	Commands  Count    `json:"commands"`
	// LastError is the hidden span's last error line, if it had one, and
	// LastErrorKept whether the effective history still holds it.
	LastError      string `json:"last_error,omitempty"`
	LastErrorKept  bool   `json:"last_error_kept"`
	TaskVerbatim   bool   `json:"task_verbatim"`
	LatestVerbatim bool   `json:"latest_verbatim"`
}

// Shrunk reports whether the reduction made the context smaller.
func (r Reduction) Shrunk() bool { return r.TokensAfter < r.TokensBefore }

// HiddenSpan is what a reduction took from the model: the messages effective
// before that are not effective after, and the earlier version of those
// whose content changed (a masked tool result), by message id.
func HiddenSpan(before, after []schema.Message) []schema.Message {
	now := make(map[string]*schema.Message, len(after))
	for i := range after {
		now[after[i].ID] = &after[i]
	}
	var span []schema.Message
	for i := range before {
		m, ok := now[before[i].ID]
		if !ok || !sameContent(before[i].Content, m.Content) {
			span = append(span, before[i])
		}
	}
	return span
}

// sameContent compares two contents block by block. Unchanged messages share
// their strings, so this is cheap for them.
func sameContent(a, b schema.Content) bool {
	if a.IsBlocks != b.IsBlocks || a.Text != b.Text || len(a.Blocks) != len(b.Blocks) {
		return false
	}
	for i := range a.Blocks {
		x, y := &a.Blocks[i], &b.Blocks[i]
		if x.Type != y.Type || x.Text != y.Text || x.ID != y.ID || x.Name != y.Name ||
			x.ToolUseID != y.ToolUseID || x.IsError != y.IsError || !bytes.Equal(x.Input, y.Input) ||
			(x.Content == nil) != (y.Content == nil) || x.Content != nil && !sameContent(*x.Content, *y.Content) {
			return false
		}
	}
	return true
}

// Measure compares the effective history before a reduction with the one
// after it. task is the first user message's text and latest the last user
// instruction given so far (UserText of the last user turn that says
// something besides tool results); each is looked for verbatim, so a
// summary that paraphrases or clips it does not count. An empty task or
// instruction counts as kept.
func Measure(before, after []schema.Message, task, latest string) Reduction {
	span := HiddenSpan(before, after)
	facts := Extract(span)
	hay := NewHaystack(after)
	r := Reduction{Hidden: len(span)}
	r.Files, r.FilesLost = countFiles(hay, after, SpanFiles(span))
	r.Paths = count(hay, facts.Paths)
	r.Errors = count(hay, facts.Errors)
	r.Commands = count(hay, facts.Commands)
	if last := lastErrorLine(span); last != "" {
		r.LastError = last
		r.LastErrorKept = strings.Contains(hay.Norm, last)
	}
	r.TaskVerbatim = strings.Contains(hay.Raw, task)
	r.LatestVerbatim = strings.Contains(hay.Raw, latest)
	return r
}

func count(h Haystack, items []string) Count {
	c := Count{Total: len(items)}
	for _, it := range items {
		if strings.Contains(h.Norm, it) {
			c.Kept++
		}
	}
	return c
}

// SpanFiles is every file the tool calls of span name, once each, in order.
func SpanFiles(span []schema.Message) []string {
	files := newSet()
	for i := range span {
		for _, b := range span[i].Content.BlocksOf() {
			if b.Type == schema.BlockToolUse {
				for _, p := range FilesInInput(b.Input) {
					files.add(p)
				}
			}
		}
	}
	return files.list
}

// countFiles counts the files that after still names, verbatim anywhere or
// through the files-touched lists of its summaries and markers, and lists
// those it does not.
func countFiles(h Haystack, after []schema.Message, files []string) (c Count, lost []string) {
	c.Total = len(files)
	if len(files) == 0 {
		return c, nil
	}
	var listed []textfacts.FileTouch
	for i := range after {
		if after[i].Synthetic() {
			listed = append(listed, textfacts.ListedFiles(after[i].Content.OwnText("\n"))...)
		}
	}
	for _, p := range files {
		if strings.Contains(h.Norm, p) || slices.ContainsFunc(listed, func(f textfacts.FileTouch) bool { return f.Covers(p) }) {
			c.Kept++
		} else {
			lost = append(lost, p)
		}
	}
	return c, lost
}

// lastErrorLine is the last error line of the span's tool results, in the
// order the agent saw them.
func lastErrorLine(span []schema.Message) string {
	for i := len(span) - 1; i >= 0; i-- {
		blocks := span[i].Content.BlocksOf()
		for j := len(blocks) - 1; j >= 0; j-- {
			if blocks[j].Type != schema.BlockToolResult || blocks[j].Content == nil {
				continue
			}
			if l := ErrorLines(contentText(*blocks[j].Content)); len(l) > 0 {
				return l[len(l)-1]
			}
		}
	}
	return ""
}

// BrokenToolPairs returns the ids of tool calls whose pairing the effective
// history breaks, given the full stored history (hidden messages included):
//   - a tool_result stored in a message that no tag hides, yet missing from
//     the effective history (dropped as an orphan: the agent sent it and its
//     model never sees it);
//   - a tool_use in the effective history whose stored result is not in it.
//
// A call whose result has not arrived yet is not broken, and neither is a
// call hidden together with its result.
func BrokenToolPairs(full, effective []schema.Message) []string {
	effUse, effResult := map[string]bool{}, map[string]bool{}
	for i := range effective {
		for _, b := range effective[i].Content.Blocks {
			switch b.Type {
			case schema.BlockToolUse:
				effUse[b.ID] = true
			case schema.BlockToolResult:
				effResult[b.ToolUseID] = true
			}
		}
	}
	broken := newSet()
	stored := map[string]bool{}
	for i := range full {
		m := &full[i]
		tagged := m.CondenseParent != "" || m.TruncationParent != ""
		for _, b := range m.Content.Blocks {
			if b.Type != schema.BlockToolResult {
				continue
			}
			stored[b.ToolUseID] = true
			if !tagged && !effResult[b.ToolUseID] {
				broken.add(b.ToolUseID)
			}
		}
	}
	for i := range effective {
		for _, b := range effective[i].Content.Blocks {
			if b.Type == schema.BlockToolUse && stored[b.ID] && !effResult[b.ID] {
				broken.add(b.ID)
			}
		}
	}
	return broken.list
}
