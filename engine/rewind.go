package engine

import (
	"fmt"
	"sort"

	"github.com/ctxpipe/ctxpipe/schema"
)

// Rewound is a planned rewind.
type Rewound struct {
	Changes              schema.Changes
	History              []schema.Message
	CutoffTS             int64 // the cutoff actually applied to messages
	RemovedCondenseIDs   []string
	RemovedTruncationIDs []string
	RemovedMaskIDs       []string // maskings undone
	MessagesRemoved      int      // agent messages deleted (summaries and markers not counted)
	MessagesRestored     int      // hidden messages that are effective again (truncation markers not counted)
}

// PlanRewind is Roo's MessageManager.rewindToTimestamp over our history and
// its condense/truncation events:
//
//  1. The condense and truncation events at or after the cutoff are undone:
//     their summaries and markers are removed even when those sit before the
//     cutoff. An event carries the ts of the input that caused it and happened
//     after that input was stored, so keeping the target (includeTarget) still
//     undoes what the target caused.
//  2. Messages from the cutoff on are removed; includeTarget keeps the
//     message whose ts is the cutoff. If no message has exactly the cutoff ts
//     but some are older, the cutoff moves to the first user message at or
//     after it (a tool's result can be stamped before the assistant message
//     that called it is stored).
//  3. Tags that name a removed summary or marker are cleared, so every
//     message they hid is restored exactly.
//
// Maskings are undone like condenses: the stand-ins of a masking made at or
// after the cutoff (MaskedAt) are removed, which restores the originals.
//
// It reports ok=false when the cutoff is after everything: nothing to rewind.
func PlanRewind(msgs []schema.Message, events []schema.ContextEventRef, cutoff int64, includeTarget bool) (Rewound, bool) {
	summaries, markers := liveIDs(msgs)
	removedC, removedT := map[string]bool{}, map[string]bool{}
	for _, ev := range events {
		if ev.TS < cutoff {
			continue
		}
		switch {
		case ev.Type == schema.EventCondenseContext && summaries[ev.ID]:
			removedC[ev.ID] = true
		case ev.Type == schema.EventSlidingWindowTruncation && markers[ev.ID]:
			removedT[ev.ID] = true
		}
	}
	removedM := map[string]bool{}
	for i := range msgs {
		if msgs[i].IsMask() && msgs[i].MaskedAt >= cutoff {
			removedM[msgs[i].CondenseID] = true
		}
	}
	exact, older := false, false
	for i := range msgs {
		exact = exact || msgs[i].TS == cutoff
		older = older || msgs[i].TS < cutoff
	}
	actual := cutoff
	if !exact && older {
		for i := range msgs {
			if msgs[i].TS >= cutoff && msgs[i].Role == schema.RoleUser {
				actual = msgs[i].TS
				break
			}
		}
	}
	keepTS := func(ts int64) bool {
		return ts < actual || (includeTarget && exact && ts == cutoff)
	}
	drops := 0
	for i := range msgs {
		if !keepTS(msgs[i].TS) {
			drops++
		}
	}
	undoCovering(msgs, keepTS, removedC, removedT, removedM)
	if drops == 0 && len(removedC) == 0 && len(removedT) == 0 && len(removedM) == 0 {
		return Rewound{}, false
	}

	before := idSet(EffectiveHistory(msgs))
	ed := newEditor(msgs)
	removed := 0
	ed.deleteWhere(func(m *schema.Message) bool {
		drop := rewindDrops(m, keepTS, removedC, removedT, removedM)
		if drop && !m.Synthetic() {
			removed++
		}
		return drop
	})
	if clear := Cleanup(ed.msgs); len(clear) > 0 {
		at := make(map[string]int, len(ed.msgs))
		for i := range ed.msgs {
			at[ed.msgs[i].ID] = i
		}
		for _, t := range clear {
			ed.tagAt(at[t.MessageID], t.Field, "")
		}
	}
	// Counted as a condense's messages_condensed and a truncation's
	// messages_removed count what they hide, truncation markers left out,
	// so that the rewind undoing one says the same number.
	restored := 0
	for _, m := range EffectiveHistory(ed.msgs) {
		if !before[m.ID] && !m.IsTruncationMarker {
			restored++
		}
	}
	return Rewound{
		Changes:              ed.changes(),
		History:              ed.msgs,
		CutoffTS:             actual,
		RemovedCondenseIDs:   sortedKeys(removedC),
		RemovedTruncationIDs: sortedKeys(removedT),
		RemovedMaskIDs:       sortedKeys(removedM),
		MessagesRemoved:      removed,
		MessagesRestored:     restored,
	}, true
}

// rewindDrops tells whether a rewind deletes m: by its ts, or as the
// summary, marker or stand-in of a reduction it undoes.
func rewindDrops(m *schema.Message, keepTS func(int64) bool, removedC, removedT, removedM map[string]bool) bool {
	return !keepTS(m.TS) ||
		(m.IsSummary && !m.IsMask() && removedC[m.CondenseID]) ||
		(m.IsTruncationMarker && removedT[m.TruncationID]) ||
		(m.IsMask() && removedM[m.CondenseID])
}

// undoCovering adds to the reductions a rewind undoes every one that hides a
// message the rewind deletes, and every one whose own summary, marker or
// stand-in it deletes, until none is left: a summary must not stand in for
// messages that are gone (it would tell the model of turns the rewind took
// back), nor a marker or stand-in, and an undone reduction is reported.
// Events order reductions by the ts of the inputs that caused them, and
// nothing makes clocks agree: a manual condense stamped by the UI behind the
// agents' latest turns, or a turn stamped ahead of its neighbours, puts a
// summarized message after a cutoff that the event lies before. Undoing a
// reduction deletes its summary, which may be hidden by a later one in
// turn: this runs even when the cutoff deletes no message by its ts, for a
// condense undone by its event alone.
func undoCovering(msgs []schema.Message, keepTS func(int64) bool, removedC, removedT, removedM map[string]bool) {
	// Which reduction each id names.
	byCondense, byTruncation := map[string]map[string]bool{}, map[string]map[string]bool{}
	for i := range msgs {
		m := &msgs[i]
		switch {
		case m.IsMask():
			byCondense[m.CondenseID] = removedM
		case m.IsSummary && m.CondenseID != "":
			byCondense[m.CondenseID] = removedC
		case m.IsTruncationMarker && m.TruncationID != "":
			byTruncation[m.TruncationID] = removedT
		}
	}
	for more := true; more; {
		more = false
		undo := func(undone map[string]bool, id string) {
			if id != "" && undone != nil && !undone[id] {
				undone[id], more = true, true
			}
		}
		for i := range msgs {
			m := &msgs[i]
			if !rewindDrops(m, keepTS, removedC, removedT, removedM) {
				continue
			}
			if m.IsSummary {
				undo(byCondense[m.CondenseID], m.CondenseID) // its own reduction
			}
			if m.IsTruncationMarker {
				undo(byTruncation[m.TruncationID], m.TruncationID)
			}
			undo(byCondense[m.CondenseParent], m.CondenseParent) // the one hiding it
			undo(byTruncation[m.TruncationParent], m.TruncationParent)
		}
	}
}

func idSet(msgs []schema.Message) map[string]bool {
	s := make(map[string]bool, len(msgs))
	for i := range msgs {
		s[msgs[i].ID] = true
	}
	return s
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func (r *run) rewind() error {
	msgs, err := r.h.Messages(r.ctx)
	if err != nil {
		return fmt.Errorf("load history of %s: %w", r.in.ConversationID, err)
	}
	evs, err := r.h.ContextEvents(r.ctx)
	if err != nil {
		return fmt.Errorf("load context events of %s: %w", r.in.ConversationID, err)
	}
	rw, ok := PlanRewind(msgs, evs, r.in.TS, r.in.IncludeTarget)
	if !ok {
		return schema.Errorf(schema.ReasonUnknownTarget, "nothing to rewind at or after ts %d", r.in.TS)
	}
	r.ch.Delete = rw.Changes.Delete
	r.ch.Tags = rw.Changes.Tags
	r.st.ContextTokens = effectiveTokens(r.st.SystemTokens, rw.History)
	r.st.Messages = len(rw.History)
	r.st.Condensations, r.st.Truncations = 0, 0
	for i := range rw.History {
		if rw.History[i].IsCondenseSummary() {
			r.st.Condensations++
		}
		if rw.History[i].IsTruncationMarker {
			r.st.Truncations++
		}
	}
	r.st.CondenseBlocked = false
	if len(r.st.Pins) > 0 {
		// A deleted message's pin goes with it.
		kept := idSet(rw.History)
		pins := map[string]bool{}
		for id, v := range r.st.Pins {
			if kept[id] {
				pins[id] = v
			}
		}
		r.st.Pins = pins
		if len(pins) == 0 {
			r.st.Pins = nil
		}
	}
	// The calls a result may answer come from the agent's turns as stored,
	// as they were when each turn was appended: a condense that hides the
	// last assistant turn does not close its calls.
	r.st.LastToolUseIDs = nil
	for i := range rw.History {
		if !rw.History[i].Synthetic() {
			r.st.LastToolUseIDs = nextToolUseIDs(r.st.LastToolUseIDs, &rw.History[i])
		}
	}
	r.st.LastTS = 0
	for i := range rw.History {
		r.st.LastTS = max(r.st.LastTS, rw.History[i].TS)
	}
	r.ch.Events = append(r.ch.Events, &schema.Rewind{
		EventHeader:          r.header(schema.EventRewind),
		CutoffTS:             r.in.TS,
		IncludeTarget:        r.in.IncludeTarget,
		RemovedCondenseIDs:   rw.RemovedCondenseIDs,
		RemovedTruncationIDs: rw.RemovedTruncationIDs,
		RemovedMaskIDs:       rw.RemovedMaskIDs,
		MessagesRemoved:      rw.MessagesRemoved,
		MessagesRestored:     rw.MessagesRestored,
	})
	return nil
}
