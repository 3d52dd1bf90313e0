package engine

import (
	"fmt"
	"slices"
	"strings"

	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/textfacts"
)

// TruncateFraction of the visible history is hidden by one truncation.
const TruncateFraction = 0.5

// TruncationMarkerText is the marker's content for n hidden messages.
func TruncationMarkerText(n int) string {
	return fmt.Sprintf("[Sliding window truncation: %d messages hidden to reduce context]", n)
}

// Bounds on what a marker carries of the messages it hides.
const (
	maxMarkerFilesChars = 2000
	markerErrors        = 2
)

// hiddenFacts is what a truncation marker says of the messages it hides,
// mechanically and briefly, so that a truncation does not drop them
// unseen: the files their tool calls touched (all of them, grouped by
// directory past the bound: textfacts.FileItems) and the last error lines of
// their tool results ("" when there are none). Each line is bounded.
func hiddenFacts(msgs []schema.Message) string {
	var b strings.Builder
	if files := textfacts.MarkerFiles(textfacts.FilesTouched(msgs), maxMarkerFilesChars); files != "" {
		b.WriteString("\n" + files)
	}
	var errs []string
	for i := len(msgs) - 1; i >= 0 && len(errs) < markerErrors; i-- {
		blocks := msgs[i].Content.BlocksOf()
		for j := len(blocks) - 1; j >= 0 && len(errs) < markerErrors; j-- {
			if blocks[j].Type != schema.BlockToolResult || blocks[j].Content == nil {
				continue
			}
			if l := textfacts.LastErrorLine(contentText(*blocks[j].Content)); l != "" && !slices.Contains(errs, l) {
				errs = append(errs, l)
			}
		}
	}
	for k := len(errs) - 1; k >= 0; k-- {
		b.WriteString("\nAn error in the hidden messages: " + errs[k])
	}
	return b.String()
}

// Truncation is a planned sliding-window truncation.
type Truncation struct {
	TruncationID string
	Removed      int // messages hidden (markers not included)
	Changes      schema.Changes
	History      []schema.Message // the full history after the truncation
}

// PlanTruncation is Roo's sliding window over the effective history: of the
// visible messages (effective, markers excluded) it hides
// floor((n−1) × frac) rounded down to an even number, starting after the
// first, and inserts a marker before the first kept message with
// ts = first kept ts − 1. Older markers in the hidden range are hidden by the
// new one, so markers do not pile up in the effective history (a rewind of
// the new truncation brings them back). It returns ok=false when it would
// hide nothing: a truncation never hides zero messages.
//
// Any input is safe: a fraction that is not a number or not positive hides
// nothing, and one of 1 or more hides all but the first and the last visible
// message. The cut never separates tool calls from their results: when the
// first kept message would answer a hidden call (an agent in the OpenAI
// format sends one result turn per call), the cut moves back to the call, so
// the results stay answered and a pending call keeps its coming results.
func PlanTruncation(msgs []schema.Message, frac float64, truncID string, count func(schema.Content) int) (Truncation, bool) {
	return PlanTruncationKeeping(msgs, frac, truncID, nil, count)
}

// PlanTruncationKeeping is PlanTruncation that leaves the messages of keep
// (MustKeep: pinned, the task, the latest instruction, closed over their
// tool exchanges) visible inside the hidden range. Removed counts only what
// it hides; when keep covers the whole range it hides nothing (ok=false).
func PlanTruncationKeeping(msgs []schema.Message, frac float64, truncID string, keep map[string]bool, count func(schema.Content) int) (Truncation, bool) {
	if !(frac > 0) { // NaN too
		return Truncation{}, false
	}
	eff := EffectiveHistory(msgs)
	visible := make([]int, 0, len(eff)) // indices into eff
	for i := range eff {
		if !eff[i].IsTruncationMarker {
			visible = append(visible, i)
		}
	}
	if len(visible) < 3 {
		return Truncation{}, false
	}
	// Compute in float and clamp before converting: int() of a huge float
	// is undefined, and the last visible message always stays.
	n := len(visible) - 2
	if f := float64(len(visible)-1) * min(frac, 1); f < float64(n) {
		n = int(f)
	}
	n -= n % 2
	// The first message kept must not be a tool result: its call would be
	// hidden. Nor a summary's acknowledgement: it would answer a summary
	// that is hidden. Step back to the exchange's (or the pair's) start; if
	// that reaches the task (the call is the first message after it), step
	// forward past it instead, so that a context over its allowed size
	// still shrinks.
	result := func(k int) bool {
		m := &eff[visible[k]]
		return m.IsSummaryAck || m.Role != schema.RoleAssistant && m.Content.HasBlock(schema.BlockToolResult)
	}
	even := n
	for n > 0 && result(n+1) {
		n--
	}
	if n <= 0 && even > 0 {
		for n = even; n < len(visible)-2 && result(n+1); n++ {
		}
		if result(n + 1) {
			n = 0
		}
	}
	if n <= 0 {
		return Truncation{}, false
	}
	// The first visible message always stays. When it is an assistant
	// turn (an earlier reduction hid the task), the results of its calls
	// stay with it: hidden, they would leave its calls unanswered.
	firstCalls := map[string]bool{}
	for _, b := range eff[visible[0]].Content.Blocks {
		if b.Type == schema.BlockToolUse {
			firstCalls[b.ID] = true
		}
	}
	answersFirst := func(m *schema.Message) bool {
		for _, b := range m.Content.Blocks {
			if b.Type == schema.BlockToolResult && firstCalls[b.ToolUseID] {
				return true
			}
		}
		return false
	}
	hide := make(map[string]bool, n)
	for _, i := range visible[1 : n+1] {
		if !keep[eff[i].ID] && !answersFirst(&eff[i]) {
			hide[eff[i].ID] = true
		}
	}
	if len(hide) == 0 {
		return Truncation{}, false
	}
	firstKept := eff[visible[n+1]].ID
	first := eff[visible[0]].ID
	effIDs := make(map[string]bool, len(eff))
	for i := range eff {
		effIDs[eff[i].ID] = true
	}

	ed := newEditor(msgs)
	keptAt, seenFirst := -1, false
	oldMarkers := map[string]bool{} // the older markers the new one hides
	for i := range ed.msgs {
		m := &ed.msgs[i]
		switch {
		case m.ID == firstKept:
			keptAt = i
		case m.ID == first:
			seenFirst = true
		case hide[m.ID]:
			ed.tagAt(i, schema.TagTruncationParent, truncID)
		case seenFirst && keptAt < 0 && m.IsTruncationMarker && effIDs[m.ID] && !keep[m.ID]:
			ed.tagAt(i, schema.TagTruncationParent, truncID)
			oldMarkers[m.ID] = true
		}
		if keptAt >= 0 {
			break
		}
	}
	n = len(hide)
	// The facts of the hidden messages, and of the older markers hidden
	// with them: the files those listed stay listed.
	var hiddenMsgs []schema.Message
	for i := range eff {
		if hide[eff[i].ID] || oldMarkers[eff[i].ID] {
			hiddenMsgs = append(hiddenMsgs, eff[i])
		}
	}
	text := schema.TextContent(TruncationMarkerText(n) + hiddenFacts(hiddenMsgs))
	marker := schema.Message{
		Turn: schema.Turn{
			ID:             DeriveID(truncID, "marker"),
			ConversationID: ed.msgs[keptAt].ConversationID,
			ProfileID:      ed.msgs[keptAt].ProfileID,
			TS:             justBefore(ed.msgs[keptAt].TS),
			Role:           schema.RoleUser,
			Content:        text,
		},
		IsTruncationMarker: true,
		TruncationID:       truncID,
		Tokens:             count(text),
	}
	ed.insertAt(keptAt, marker)
	return Truncation{TruncationID: truncID, Removed: n, Changes: ed.changes(), History: ed.msgs}, true
}
