package engine

import (
	"regexp"
	"strings"

	"github.com/ctxpipe/ctxpipe/prompts"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/tokens"
)

// NMessagesToKeep is how many of the latest messages a keep_tail condense
// leaves untouched (Roo's N_MESSAGES_TO_KEEP).
const NMessagesToKeep = 3

// PreserveFraction of the characters a preserve_fraction condense keeps
// (Gemini's COMPRESSION_PRESERVE_THRESHOLD); the rest is summarized.
const PreserveFraction = 0.3

// CondensePlan is a condense chosen but not yet summarized: the request for
// the summarizer and how to apply its answer.
type CondensePlan struct {
	Strategy   schema.Strategy
	CondenseID string
	Request    schema.SummaryRequest
	finish     func(summary string, count func(schema.Content) int) Condensed
}

// Condensed is a condense applied in memory.
type Condensed struct {
	Changes           schema.Changes
	History           []schema.Message // full history after the condense
	Summary           schema.Message
	MessagesCondensed int
}

// Finish applies the summarizer's text: tags the condensed messages and
// inserts the summary message. count gives the summary's token count.
func (p *CondensePlan) Finish(summary string, count func(schema.Content) int) Condensed {
	return p.finish(summary, count)
}

// CondenseOptions refine a condense.
type CondenseOptions struct {
	// Keep are the ids of messages that must stay visible (MustKeep).
	Keep map[string]bool
	// Instructions are a manual request's own instructions to the summarizer.
	Instructions string
	// MaskResults sends the summarizer every tool result of its span as a
	// masked stand-in (the profile masks): the summary should not repeat
	// tool output, and the stand-ins keep the tool, its key arguments and
	// the last error line.
	MaskResults bool
}

// PlanCondense chooses what to summarize with the profile's strategy,
// keeping what MustKeep says must survive (pinned flags as stored). It
// returns a *schema.Error with ReasonNotEnoughMessages or
// ReasonCondensedRecently when there is nothing worth condensing.
func PlanCondense(msgs []schema.Message, p *schema.Profile, inputID string) (*CondensePlan, error) {
	return PlanCondenseWith(msgs, p, inputID, CondenseOptions{Keep: MustKeep(msgs, nil, p)})
}

// PlanCondenseWith is PlanCondense with explicit options.
func PlanCondenseWith(msgs []schema.Message, p *schema.Profile, inputID string, o CondenseOptions) (*CondensePlan, error) {
	id := DeriveID(inputID, "condense")
	var plan *CondensePlan
	var err error
	keep := o.Keep
	if keep == nil {
		keep = map[string]bool{}
	}
	switch s := p.StrategyOrDefault(); s {
	case schema.StrategyFreshStart:
		plan, err = planFreshStart(msgs, id, keep, o.MaskResults)
	case schema.StrategyPreserveFraction:
		plan, err = planPreserveFraction(msgs, id, keep)
		if err == nil && o.MaskResults {
			plan.Request.Source = plan.Request.Messages
			plan.Request.Messages = maskRequest(plan.Request.Messages, msgs)
		}
	default:
		plan, err = planKeepTail(msgs, id, keep)
		if err == nil && o.MaskResults {
			plan.Request.Source = plan.Request.Messages
			plan.Request.Messages = maskRequest(plan.Request.Messages, msgs)
		}
	}
	if err != nil {
		return nil, err
	}
	prompt, final := prompts.For(plan.Strategy, p.CustomPrompt)
	plan.CondenseID = id
	plan.Request.Prompt = prompt
	plan.Request.Profile = *p
	plan.Request.Strategy = plan.Strategy
	plan.Request.Instructions = o.Instructions
	if len(msgs) > 0 {
		plan.Request.ConversationID = msgs[0].ConversationID
	}
	plan.Request.Messages = append(stripImages(plan.Request.Messages), schema.Message{
		Turn: schema.Turn{Role: schema.RoleUser, Content: schema.TextContent(final)},
	})
	return plan, nil
}

// planKeepTail is Roo ≤ 3.42: keep the first message and the last three,
// summarize what lies between since the last summary, and insert an
// assistant summary just before the kept tail.
func planKeepTail(msgs []schema.Message, id string, keep map[string]bool) (*CondensePlan, error) {
	keepStart := max(len(msgs)-NMessagesToKeep, 0)
	since := sinceLastSummary(msgs[:keepStart], msgs)
	if len(since) <= 1 {
		return nil, schema.Errorf(schema.ReasonNotEnoughMessages, "%d messages to summarize; need at least 2 besides the last %d", len(since), NMessagesToKeep)
	}
	for i := keepStart; i < len(msgs); i++ {
		if msgs[i].IsCondenseSummary() {
			return nil, schema.Errorf(schema.ReasonCondensedRecently, "a summary is among the last %d messages", NMessagesToKeep)
		}
	}
	// The summary can only shrink the context by hiding something: when
	// every visible message it would hide must stay (pinned, the task, the
	// latest instruction), it is refused before the model is asked, as the
	// other strategies refuse it, rather than paid for, found to have made
	// the context grow, and latched.
	visible := idSet(EffectiveHistory(msgs))
	hideable := 0
	for i := 1; i < keepStart; i++ {
		m := &msgs[i]
		if m.CondenseParent == "" && !keep[m.ID] && visible[m.ID] && !m.IsTruncationMarker {
			hideable++
		}
	}
	if hideable == 0 {
		return nil, schema.Errorf(schema.ReasonNotEnoughMessages, "every message before the last %d must stay", NMessagesToKeep)
	}
	toolUses, reasoning := toolBlocksToPreserve(msgs, keepStart, keep)
	plan := &CondensePlan{Strategy: schema.StrategyKeepTail}
	// The span may end with calls whose results are kept: the summarizer
	// sees those results too, and a synthetic one for a call still pending.
	plan.Request.Messages = withDeferredToolResults(withTailResults(visibleOf(since, msgs), msgs[keepStart:]))
	plan.finish = func(text string, count func(schema.Content) int) Condensed {
		content := []schema.Block{{Type: schema.BlockReasoning, Text: prompts.SyntheticReasoning}}
		content = append(content, reasoning...)
		content = append(content, schema.Block{Type: schema.BlockText, Text: text})
		content = append(content, toolUses...)
		kept := &msgs[keepStart]
		ed := newEditor(msgs)
		n, visible := 0, idSet(EffectiveHistory(msgs))
		for i := 1; i < keepStart; i++ {
			n += condenseAt(ed, i, id, keep, visible)
		}
		sum := summaryMessage(id, kept, schema.RoleAssistant, justBefore(kept.TS), schema.BlockContent(content...), count)
		ed.insertAt(keepStart, sum)
		return Condensed{Changes: ed.changes(), History: ed.msgs, Summary: sum, MessagesCondensed: n}
	}
	return plan, nil
}

// sinceLastSummary is Roo's getMessagesSinceLastSummary over head: from the
// last summary on, with the conversation's first message put in front when
// that summary is an assistant message (a request must start with a user turn).
func sinceLastSummary(head, all []schema.Message) []schema.Message {
	last := -1
	for i := range head {
		if head[i].IsCondenseSummary() {
			last = i
		}
	}
	if last < 0 {
		return head
	}
	since := head[last:]
	if head[last].Role == schema.RoleAssistant && len(all) > 0 {
		since = append([]schema.Message{all[0]}, since...)
	}
	return since
}

// toolBlocksToPreserve is Roo's getKeepMessagesWithToolBlocks, made to hold
// for agents that answer parallel calls with one result turn each: every
// call that the condense hides and that a kept message answers, or whose
// result is still to come, goes into the summary (with the reasoning blocks
// of the turn that made it), however far before the cut it was made. No
// tool_result in the kept tail, or arriving later, then loses its call.
//
// A call in a message that stays visible anyway (kept, see MustKeep) needs
// no copy.
func toolBlocksToPreserve(msgs []schema.Message, keepStart int, keep map[string]bool) (toolUses, reasoning []schema.Block) {
	if keepStart <= 0 || keepStart >= len(msgs) {
		return nil, nil
	}
	want := openToolUses(msgs)
	if want == nil {
		want = map[string]bool{}
	}
	for i := keepStart; i < len(msgs); i++ {
		for _, b := range msgs[i].Content.Blocks {
			if b.Type == schema.BlockToolResult {
				want[b.ToolUseID] = true
			}
		}
	}
	for i := range msgs { // a call in the tail, or kept, stays visible
		if i < keepStart && !keep[msgs[i].ID] {
			continue
		}
		for _, b := range msgs[i].Content.Blocks {
			if b.Type == schema.BlockToolUse {
				delete(want, b.ID)
			}
		}
	}
	// The first message stays visible unless something hid it already; a
	// call there needs no copy (a copy would repeat its id).
	stop := 1
	if summaries, markers := liveIDs(msgs); hidden(&msgs[0], summaries, markers) {
		stop = 0
	}
	// Search back from the cut; a reused id is answered by its latest call.
	type carry struct{ uses, reasoning []schema.Block }
	var found []carry // newest turn first
	for i := keepStart - 1; i >= stop && len(want) > 0; i-- {
		var c carry
		for _, b := range msgs[i].Content.Blocks {
			if b.Type == schema.BlockToolUse && want[b.ID] {
				c.uses = append(c.uses, b)
				delete(want, b.ID)
			}
		}
		if len(c.uses) == 0 {
			continue
		}
		for _, b := range msgs[i].Content.Blocks {
			if b.Type == schema.BlockReasoning {
				c.reasoning = append(c.reasoning, b)
			}
		}
		found = append(found, c)
	}
	for k := len(found) - 1; k >= 0; k-- {
		toolUses = append(toolUses, found[k].uses...)
		reasoning = append(reasoning, found[k].reasoning...)
	}
	return toolUses, reasoning
}

// planFreshStart is Roo ≥ 3.43: everything so far is tagged and a user
// summary is appended; the model then starts fresh from the summary. Two
// departures keep it safe: at least two messages must follow the last
// summary (Roo's guard against condense loops), and a last assistant turn
// whose calls still wait for results stays visible after the summary, so the
// results the agent sends next keep their calls.
//
// Kept messages (MustKeep: the task, the latest instruction, pinned ones)
// stay visible before the summary. They count for Roo's two-message guard,
// but something else must be hidden too: two messages with no summary yet,
// one after a summary (which is summarized again).
func planFreshStart(msgs []schema.Message, id string, keep map[string]bool, maskResults bool) (*CondensePlan, error) {
	keepFrom := pendingTurn(msgs)
	pending := idSet(msgs[keepFrom:])
	eff := EffectiveHistory(msgs)
	span := eff[:0] // eff is ours: filter in place
	// last is the last summary in span; since counts the agent messages
	// after it, hideable those of them that need not stay.
	last, since, hideable := -1, 0, 0
	for _, m := range eff {
		if pending[m.ID] {
			continue
		}
		span = append(span, m)
		switch {
		case m.IsCondenseSummary():
			last, since, hideable = len(span)-1, 0, 0
		case !m.Synthetic() || m.IsMask():
			since++
			if !keep[m.ID] {
				hideable++
			}
		}
	}
	// Roo's guard: after a summary, two new messages are needed; fewer is
	// "condensed recently", as Roo words it. The condense must also hide
	// something besides the summary: with no summary yet, two messages.
	switch {
	case last >= 0 && since == 0:
		return nil, schema.Errorf(schema.ReasonCondensedRecently, "nothing was said since the last summary")
	case last >= 0 && since < 2:
		return nil, schema.Errorf(schema.ReasonCondensedRecently, "%d message since the last summary; need at least 2", since)
	case last >= 0 && hideable == 0:
		return nil, schema.Errorf(schema.ReasonNotEnoughMessages, "every message since the last summary must stay")
	case last < 0 && hideable < 2:
		return nil, schema.Errorf(schema.ReasonNotEnoughMessages, "%d messages to summarize; need at least 2", hideable)
	}
	plan := &CondensePlan{Strategy: schema.StrategyFreshStart}
	req := withDeferredToolResults(span)
	plan.Request.Source = req // unmasked: the files touched come from whole inputs
	if maskResults {
		req = maskRequest(req, msgs)
	}
	plan.Request.Messages = toolBlocksAsText(req)
	commands := ""
	if len(msgs) > 0 && !keep[msgs[0].ID] {
		commands = commandBlocks(msgs[0])
	}
	plan.finish = func(text string, count func(schema.Content) int) Condensed {
		ed := newEditor(msgs)
		n, visible := 0, idSet(EffectiveHistory(msgs))
		for i := 0; i < keepFrom; i++ {
			n += condenseAt(ed, i, id, keep, visible)
		}
		ref, ts := &msgs[len(msgs)-1], msgs[len(msgs)-1].TS // at the end: the last ts (ts.go)
		if keepFrom < len(msgs) {
			ref, ts = &msgs[keepFrom], justBefore(msgs[keepFrom].TS)
		}
		sum := summaryMessage(id, ref, schema.RoleUser, ts, summaryContent(text, commands), count)
		ed.insertAt(keepFrom, sum)
		return Condensed{Changes: ed.changes(), History: ed.msgs, Summary: sum, MessagesCondensed: n}
	}
	return plan, nil
}

// pendingTurn is the index of the last assistant turn when some of its calls
// still wait for results and it is visible; len(msgs) otherwise. A condense
// keeps it, and the result turns after it, in the effective history.
func pendingTurn(msgs []schema.Message) int {
	if len(openToolUses(msgs)) == 0 {
		return len(msgs)
	}
	summaries, markers := liveIDs(msgs)
	for i := len(msgs) - 1; i >= 0; i-- {
		m := &msgs[i]
		if m.Role != schema.RoleAssistant || m.Synthetic() {
			continue
		}
		if hidden(m, summaries, markers) {
			return len(msgs)
		}
		return i
	}
	return len(msgs)
}

// summaryContent is a user summary's content: the summarizer's text, then
// the first message's <command> blocks, which must survive every condense.
func summaryContent(text, commands string) schema.Content {
	blocks := []schema.Block{{Type: schema.BlockText, Text: text}}
	if commands != "" {
		blocks = append(blocks, schema.Block{Type: schema.BlockText, Text: "<system-reminder>\n" + commands + "\n</system-reminder>"})
	}
	return schema.BlockContent(blocks...)
}

// planPreserveFraction is Gemini CLI's compression: summarize the oldest 70 %
// of the effective history's characters, split at a SplitPoint boundary, and
// put a user summary before what is kept, followed by an assistant
// acknowledgement (Gemini's model turn after its snapshot) unless the kept
// part opens with an assistant message. The summary carries the first
// message's <command> blocks, as fresh_start's does, since the first message
// is among the summarized.
//
// Kept messages (MustKeep) before the split stay visible before the summary.
func planPreserveFraction(msgs []schema.Message, id string, keep map[string]bool) (*CondensePlan, error) {
	eff := EffectiveHistory(msgs)
	split := SplitPoint(eff, 1-PreserveFraction)
	if split == 0 {
		return nil, schema.Errorf(schema.ReasonNotEnoughMessages, "no boundary to split at")
	}
	// What the condense would hide besides summaries and their
	// acknowledgements: nothing new when only the last summary (with the
	// messages that must stay anyway, the task say) lies before the split.
	hides, summaries := 0, 0
	for i := range eff[:split] {
		switch m := &eff[i]; {
		case keep[m.ID]:
		case m.IsCondenseSummary():
			summaries++
		case !m.IsSummaryAck:
			hides++
		}
	}
	switch {
	case hides == 0 && summaries > 0:
		return nil, schema.Errorf(schema.ReasonCondensedRecently, "only the last summary would be summarized")
	case hides == 0:
		return nil, schema.Errorf(schema.ReasonNotEnoughMessages, "every message before the split must stay")
	}
	plan := &CondensePlan{Strategy: schema.StrategyPreserveFraction}
	plan.Request.Messages = eff[:split]
	commands := ""
	if len(msgs) > 0 && !keep[msgs[0].ID] {
		commands = commandBlocks(msgs[0])
	}
	plan.finish = func(text string, count func(schema.Content) int) Condensed {
		ed := newEditor(msgs)
		at, n, visible := len(ed.msgs), 0, idSet(eff)
		for i := range ed.msgs {
			if split < len(eff) && ed.msgs[i].ID == eff[split].ID {
				at = i
				break
			}
			n += condenseAt(ed, i, id, keep, visible)
		}
		ref, ts := &msgs[len(msgs)-1], msgs[len(msgs)-1].TS // at the end: the last ts (ts.go)
		if at < len(ed.msgs) {
			ref, ts = &ed.msgs[at], justBefore(ed.msgs[at].TS)
		}
		sum := summaryMessage(id, ref, schema.RoleUser, ts, summaryContent(text, commands), count)
		ed.insertAt(at, sum)
		if split == len(eff) || eff[split].Role != schema.RoleAssistant {
			ack := summaryMessage(id, ref, schema.RoleAssistant, ts, schema.TextContent(prompts.SummaryAck), count)
			ack.ID, ack.IsSummaryAck = DeriveID(id, "ack"), true
			ed.insertAt(at+1, ack)
		}
		return Condensed{Changes: ed.changes(), History: ed.msgs, Summary: sum, MessagesCondensed: n}
	}
	return plan, nil
}

// SplitPoint is Gemini's findCompressSplitPoint, extended to tool-calling
// agents: the index of the first boundary at which the characters before it
// reach fraction of the total. A boundary is a user message without tool
// results (Gemini's rule) or an assistant message right after a complete
// call/result exchange: in an agent run every user turn after the first
// holds only tool results, so Gemini's rule alone finds nothing to split at.
// No boundary falls between a call and its results. If none reaches the
// fraction, everything is compressed when the last message is an assistant
// message without tool calls; otherwise the last boundary is used (0:
// nothing can be compressed). Characters are counted as Gemini counts them
// (geminiChars).
func SplitPoint(msgs []schema.Message, fraction float64) int {
	chars := make([]int, len(msgs))
	total := 0
	for i := range msgs {
		chars[i] = geminiChars(&msgs[i])
		total += chars[i]
	}
	target := float64(total) * fraction
	last, cum := 0, 0
	var open []string // calls of the latest assistant turn still unanswered
	for i := range msgs {
		m := &msgs[i]
		boundary := false
		switch m.Role {
		case schema.RoleUser:
			boundary = !m.Content.HasBlock(schema.BlockToolResult)
		case schema.RoleAssistant:
			boundary = i > 0 && len(open) == 0 && msgs[i-1].Content.HasBlock(schema.BlockToolResult)
		}
		if boundary {
			if float64(cum) >= target {
				return i
			}
			last = i
		}
		open = nextToolUseIDs(open, m)
		cum += chars[i]
	}
	if n := len(msgs); n > 0 && msgs[n-1].Role == schema.RoleAssistant && !msgs[n-1].Content.HasBlock(schema.BlockToolUse) {
		return n
	}
	return last
}

// geminiChars is Gemini's measure of a message, JSON.stringify(content)
// .length: the message as a Gemini Content ({"role": "user" or "model",
// "parts": [...]}, a text block as a {"text": ...} part, any other block as
// its own JSON), in UTF-16 code units as JavaScript counts a string's
// length, not in bytes: text in CJK scripts weighs three times less than
// its UTF-8.
func geminiChars(m *schema.Message) int {
	role := "user"
	if m.Role == schema.RoleAssistant {
		role = "model"
	}
	parts := []any{}
	for _, b := range m.Content.BlocksOf() {
		if b.Type == schema.BlockText {
			parts = append(parts, struct {
				Text string `json:"text"`
			}{b.Text})
			continue
		}
		parts = append(parts, b)
	}
	js, _ := schema.Marshal(struct {
		Role  string `json:"role"`
		Parts []any  `json:"parts"`
	}{role, parts})
	n := 0
	for _, r := range string(js) {
		n++
		if r >= 0x10000 { // a surrogate pair
			n++
		}
	}
	return n
}

func summaryMessage(id string, ref *schema.Message, role schema.Role, ts int64, c schema.Content, count func(schema.Content) int) schema.Message {
	return schema.Message{
		Turn: schema.Turn{
			ID:             DeriveID(id, "summary"),
			ConversationID: ref.ConversationID,
			ProfileID:      ref.ProfileID,
			TS:             ts,
			Role:           role,
			Content:        c,
		},
		IsSummary:  true,
		CondenseID: id,
		Tokens:     count(c),
	}
}

// visibleOf keeps the messages of sub that are in the effective history of
// all (as the effective history has them: orphaned tool results dropped).
func visibleOf(sub, all []schema.Message) []schema.Message {
	want := make(map[string]bool, len(sub))
	for i := range sub {
		want[sub[i].ID] = true
	}
	var out []schema.Message
	for _, m := range EffectiveHistory(all) {
		if want[m.ID] {
			out = append(out, m)
		}
	}
	return out
}

// stripImages replaces image blocks (also inside tool results) with a short
// text: a summary needs no pixels, and images are the costliest input.
func stripImages(msgs []schema.Message) []schema.Message {
	noImage := func(b schema.Block) schema.Block {
		if b.Type == schema.BlockImage {
			return schema.Block{Type: schema.BlockText, Text: "[image omitted]"}
		}
		return b
	}
	return mapBlocks(msgs, func(b schema.Block) schema.Block {
		if b.Type == schema.BlockToolResult && b.Content != nil && b.Content.IsBlocks {
			nested := make([]schema.Block, len(b.Content.Blocks))
			for i, nb := range b.Content.Blocks {
				nested[i] = noImage(nb)
			}
			c := schema.BlockContent(nested...)
			b.Content = &c
		}
		return noImage(b)
	})
}

// mapBlocks returns copies of msgs with f applied to every block of
// array-form content; the stored messages are left as they are.
func mapBlocks(msgs []schema.Message, f func(schema.Block) schema.Block) []schema.Message {
	out := make([]schema.Message, len(msgs))
	for i, m := range msgs {
		out[i] = m
		if !m.Content.IsBlocks {
			continue
		}
		blocks := make([]schema.Block, len(m.Content.Blocks))
		for j, b := range m.Content.Blocks {
			blocks[j] = f(b)
		}
		out[i].Content = schema.BlockContent(blocks...)
	}
	return out
}

// withDeferredToolResults answers every tool call that has no result yet
// with a synthetic one, so the summarizer's request is a valid tool exchange.
func withDeferredToolResults(msgs []schema.Message) []schema.Message {
	answered := map[string]bool{}
	for i := range msgs {
		for _, b := range msgs[i].Content.Blocks {
			if b.Type == schema.BlockToolResult {
				answered[b.ToolUseID] = true
			}
		}
	}
	var pending []schema.Block
	for i := range msgs {
		for _, b := range msgs[i].Content.Blocks {
			if b.Type == schema.BlockToolUse && !answered[b.ID] {
				c := schema.TextContent(prompts.ToolDeferred)
				pending = append(pending, schema.Block{Type: schema.BlockToolResult, ToolUseID: b.ID, Content: &c})
			}
		}
	}
	if len(pending) == 0 {
		return msgs
	}
	out := append([]schema.Message(nil), msgs...)
	return append(out, schema.Message{Turn: schema.Turn{Role: schema.RoleUser, Content: schema.BlockContent(pending...)}})
}

// withTailResults appends, after a summarized span, the results that the
// kept tail holds for the span's calls, so the summarizer sees what each
// call it reads returned. Only the result turns right after the cut count:
// the tail's first assistant turn starts exchanges of its own.
func withTailResults(span, tail []schema.Message) []schema.Message {
	calls := map[string]bool{}
	for i := range span {
		for _, b := range span[i].Content.Blocks {
			switch b.Type {
			case schema.BlockToolUse:
				calls[b.ID] = true
			case schema.BlockToolResult:
				delete(calls, b.ToolUseID)
			}
		}
	}
	var results []schema.Block
	for i := 0; i < len(tail) && len(calls) > 0 && tail[i].Role != schema.RoleAssistant; i++ {
		for _, b := range tail[i].Content.Blocks {
			if b.Type == schema.BlockToolResult && calls[b.ToolUseID] {
				results = append(results, b)
				delete(calls, b.ToolUseID)
			}
		}
	}
	if len(results) == 0 {
		return span
	}
	return append(span[:len(span):len(span)], schema.Message{Turn: schema.Turn{Role: schema.RoleUser, Content: schema.BlockContent(results...)}})
}

// toolBlocksAsText turns tool calls and results into text blocks, so the
// summarizer request needs no tool definitions (providers reject tool blocks
// without them).
func toolBlocksAsText(msgs []schema.Message) []schema.Message {
	return mapBlocks(msgs, func(b schema.Block) schema.Block {
		switch b.Type {
		case schema.BlockToolUse:
			return schema.Block{Type: schema.BlockText, Text: tokens.SerializeToolUse(&b)}
		case schema.BlockToolResult:
			return schema.Block{Type: schema.BlockText, Text: tokens.SerializeToolResult(&b)}
		}
		return b
	})
}

// commandPattern matches a <command> element, bare or with attributes
// (<command name="deploy">), across lines. The name must end at the tag
// name's end, so <commands> or <commander> do not match.
var commandPattern = regexp.MustCompile(`(?s)<command(?:\s[^>]*)?>.*?</command>`)

// commandBlocks returns the <command> blocks of a message's text, which a
// summary carries so that slash-command instructions survive every condense.
// The text blocks are joined first: an agent may split one element across
// two blocks.
func commandBlocks(m schema.Message) string {
	var text []string
	for _, b := range m.Content.BlocksOf() {
		if b.Type == schema.BlockText {
			text = append(text, b.Text)
		}
	}
	return strings.Join(commandPattern.FindAllString(strings.Join(text, "\n"), -1), "\n")
}

// condenseAt hides message i behind condense id, unless a condense hides
// it already or it must stay (keep), and returns what that adds to the
// condense's messages_condensed: one if the message was in the effective
// history, nothing if an earlier truncation hid it already (it is tagged
// all the same) or if it is a truncation marker (a truncation's
// messages_removed and a rewind's messages_restored leave markers out too).
func condenseAt(ed *editor, i int, id string, keep, visible map[string]bool) int {
	m := &ed.msgs[i]
	if m.CondenseParent != "" || keep[m.ID] {
		return 0
	}
	ed.tagAt(i, schema.TagCondenseParent, id)
	if visible[m.ID] && !m.IsTruncationMarker {
		return 1
	}
	return 0
}
