package engine

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/textfacts"
)

// Observation masking (after JetBrains' "The Complexity Trap" and
// Anthropic's context editing): the bodies of older tool results leave the
// effective history, each replaced by one line that names the tool, its key
// arguments and the size hidden. It costs no model call, keeps every call
// and its result paired, and a summarizer that runs afterwards reads the
// masked history, which is far smaller.
//
// It hides the way a condense does, so the store's queries need nothing new:
// each message with a masked result gets a stand-in, a copy inserted right
// after it with the masked bodies, marked as a summary whose condense id is
// the mask id; the original is tagged condense_parent = mask id. A rewind to
// the masking's ts (MaskedAt) deletes the stand-ins, and the cleared tags
// bring the originals back byte for byte.

// MaskOptions say which tool results a masking may replace.
type MaskOptions struct {
	// KeepLast most recent tool results stay whole.
	KeepLast int
	// ExcludeTools are tool names whose results are never masked.
	ExcludeTools []string
	// Keep are message ids never masked (MustKeep: pinned messages, the
	// task, the latest instruction), which stay verbatim.
	Keep map[string]bool
}

// Masked is a planned masking.
type Masked struct {
	MaskID   string
	Count    int // tool results masked
	Messages int // stand-ins inserted
	Changes  schema.Changes
	History  []schema.Message // the full history after the masking
}

// PlanMask masks every tool result of the visible history except the last
// o.KeepLast, results of excluded tools, results in kept messages, results
// already masked and results no longer than their stand-in. ts is the
// masking input's ts, recorded on each stand-in for rewind. It returns
// ok=false when nothing would be masked.
func PlanMask(msgs []schema.Message, o MaskOptions, maskID string, ts int64, count func(schema.Content) int) (Masked, bool) {
	summaries, markers := liveIDs(msgs)
	calls := map[string]schema.Block{}
	for b := range blocksOf(msgs) {
		if b.Type == schema.BlockToolUse {
			calls[b.ID] = b
		}
	}
	type pos struct{ msg, block int }
	var results []pos
	for i := range msgs {
		m := &msgs[i]
		if m.Role != schema.RoleUser || hidden(m, summaries, markers) {
			continue
		}
		for j, b := range m.Content.Blocks {
			if b.Type == schema.BlockToolResult {
				results = append(results, pos{i, j})
			}
		}
	}
	cut := max(len(results)-max(o.KeepLast, 0), 0)
	masked := map[int][]schema.Block{} // message index → its blocks, masked
	n := 0
	for _, at := range results[:cut] {
		m := &msgs[at.msg]
		if o.Keep[m.ID] || (m.IsMask() && o.Keep[m.MaskOf]) {
			continue
		}
		b := m.Content.Blocks[at.block]
		call, known := calls[b.ToolUseID]
		if known && slices.Contains(o.ExcludeTools, call.Name) {
			continue
		}
		body := ""
		if b.Content != nil {
			body = contentText(*b.Content)
		}
		if strings.HasPrefix(body, textfacts.MaskPrefix) {
			continue
		}
		size := count(schema.BlockContent(b))
		c := schema.TextContent(standIn(call, known, body, b.IsError, size))
		sb := schema.Block{Type: schema.BlockToolResult, ToolUseID: b.ToolUseID, IsError: b.IsError, Content: &c}
		if count(schema.BlockContent(sb)) >= size {
			continue // the stand-in would be no smaller
		}
		blocks := masked[at.msg]
		if blocks == nil {
			blocks = slices.Clone(m.Content.Blocks)
		}
		blocks[at.block] = sb
		masked[at.msg] = blocks
		n++
	}
	if n == 0 {
		return Masked{}, false
	}
	order := make([]int, 0, len(masked))
	for i := range masked {
		order = append(order, i)
	}
	slices.Sort(order)
	ed := newEditor(msgs)
	// From the end, so each index still names its message when its turn comes.
	for k := len(order) - 1; k >= 0; k-- {
		i := order[k]
		orig := &msgs[i]
		s := *orig
		s.ID = DeriveID(maskID, orig.ID)
		s.Content = schema.BlockContent(masked[i]...)
		s.IsSummary, s.CondenseID, s.CondenseParent, s.TruncationParent = true, maskID, "", ""
		s.MaskOf, s.MaskedAt = orig.ID, ts
		if orig.IsMask() {
			s.MaskOf = orig.MaskOf
		}
		s.Tokens = count(s.Content)
		ed.tagAt(i, schema.TagCondenseParent, maskID)
		ed.insertAt(i+1, s)
	}
	return Masked{MaskID: maskID, Count: n, Messages: len(order), Changes: ed.changes(), History: ed.msgs}, true
}

// contentText is a tool result's text: its string, or its text blocks joined.
func contentText(c schema.Content) string {
	if !c.IsBlocks {
		return c.Text
	}
	var parts []string
	for _, b := range c.Blocks {
		switch b.Type {
		case schema.BlockText:
			parts = append(parts, b.Text)
		case schema.BlockImage:
			parts = append(parts, "[image]")
		}
	}
	return strings.Join(parts, "\n")
}

// standInKeys are the tool-input keys worth naming in a stand-in, in the
// order they are named: what the call read or ran.
var standInKeys = []string{
	"path", "file_path", "filepath", "filename", "file_name", "file", "absolute_path", "target_file",
	"notebook_path", "paths", "files", "dir", "dir_path", "directory",
	"command", "cmd", "query", "pattern", "regex", "url", "symbol", "name",
}

const (
	maxStandInArg  = 200 // characters of one argument's value
	maxStandInArgs = 3
)

// standIn is the one line that replaces a tool result's body
// (textfacts.StandIn): the tool, its key arguments, the size hidden and the
// error notes.
func standIn(call schema.Block, known bool, body string, isError bool, tokens int) string {
	var b strings.Builder
	name := call.Name
	if !known || name == "" {
		name = "tool"
	}
	b.WriteString(name)
	if args := keyArgs(call.Input); args != "" {
		b.WriteString(" ")
		b.WriteString(args)
	}
	lines := strings.Count(strings.TrimRight(body, "\n"), "\n") + 1
	if body == "" {
		lines = 0
	}
	fmt.Fprintf(&b, "; %d tokens, %d lines hidden", tokens, lines)
	return textfacts.StandIn(b.String(), isError, body)
}

// shortStandIn is a summarizer request's stand-in: the size and the error
// notes only.
func shortStandIn(body string, isError bool) string {
	lines := strings.Count(strings.TrimRight(body, "\n"), "\n") + 1
	return textfacts.StandIn(fmt.Sprintf("%d lines", lines), isError, body)
}

// keyArgs renders the input's key arguments as key=value (values quoted,
// on one line, clipped), or the clipped raw input when it has none of them.
func keyArgs(input json.RawMessage) string {
	var obj map[string]any
	if json.Unmarshal(input, &obj) != nil || len(obj) == 0 {
		return clipLine(strings.TrimSpace(string(input)), maxStandInArg)
	}
	var parts []string
	for _, k := range standInKeys {
		v, ok := obj[k]
		if !ok {
			continue
		}
		var s string
		switch t := v.(type) {
		case string:
			s = t
		default:
			raw, _ := json.Marshal(t)
			s = string(raw)
		}
		parts = append(parts, k+"="+quoteArg(clipLine(s, maxStandInArg)))
		if len(parts) == maxStandInArgs {
			break
		}
	}
	if len(parts) == 0 {
		return clipLine(string(input), maxStandInArg)
	}
	return strings.Join(parts, " ")
}

// quoteArg quotes s as a JSON string without escaping <, > and &, which a
// command uses often and a reader should see as typed.
func quoteArg(s string) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	return strings.TrimSuffix(b.String(), "\n")
}

// clipLine puts s on one line (white space collapsed) and clips it to n
// characters, marking the cut.
func clipLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n]) + "…"
	}
	return s
}

// maxRequestInput is the size above which a tool call's input is clipped in
// a masked summarizer request, and maxRequestValue the length a string
// value keeps: its first line, which names what a heredoc writes.
const (
	maxRequestInput = 600
	maxRequestValue = 200
)

// clipInput shortens the long string values of a tool input (files written
// through a heredoc, patches) to their first line and a note of what was
// left out, for a summarizer that needs the action, not the file.
func clipInput(in json.RawMessage) json.RawMessage {
	if len(in) <= maxRequestInput {
		return in
	}
	var obj map[string]any
	if json.Unmarshal(in, &obj) != nil {
		return in
	}
	for k, v := range obj {
		s, ok := v.(string)
		if !ok || len(s) <= maxRequestValue {
			continue
		}
		first, _, _ := strings.Cut(s, "\n")
		first = clipLine(first, maxRequestValue)
		obj[k] = fmt.Sprintf("%s [ctxpipe left out %d more characters, %d lines]", first, len(s)-len(first), strings.Count(s, "\n"))
	}
	var out strings.Builder
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false) // commands are full of <, > and &
	if enc.Encode(obj) != nil {
		return in
	}
	return json.RawMessage(strings.TrimSuffix(out.String(), "\n"))
}

// maskRequest returns copies of a summarizer request's messages with every
// tool result's body replaced by its stand-in (when that is smaller); all is
// the history the calls are looked up in. The stored messages are untouched.
func maskRequest(req, all []schema.Message) []schema.Message {
	calls := map[string]schema.Block{}
	for _, ms := range [][]schema.Message{all, req} {
		for b := range blocksOf(ms) {
			if b.Type == schema.BlockToolUse {
				calls[b.ID] = b
			}
		}
	}
	return mapBlocks(req, func(b schema.Block) schema.Block {
		if b.Type == schema.BlockToolUse {
			b.Input = clipInput(b.Input)
			return b
		}
		if b.Type != schema.BlockToolResult || b.Content == nil {
			return b
		}
		body := contentText(*b.Content)
		if strings.HasPrefix(body, textfacts.MaskPrefix) {
			// A stand-in of the history: its short form.
			if short, ok := textfacts.ShortStandIn(body); ok {
				c := schema.TextContent(short)
				b.Content = &c
			}
			return b
		}
		if len(body) < maxStandInArg {
			return b
		}
		// The call is right before its result in the request: the short
		// form need not name it again.
		c := schema.TextContent(shortStandIn(body, b.IsError))
		if len(c.Text) >= len(body) {
			return b
		}
		b.Content = &c
		return b
	})
}
