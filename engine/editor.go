package engine

import "github.com/ctxpipe/ctxpipe/schema"

// editor is an in-memory history that records every edit as schema.Changes,
// so a planner can look at the history as it will be after its own edits
// (for recounting) while producing exactly what the store will commit.
type editor struct {
	msgs []schema.Message
	ch   schema.Changes
}

func newEditor(msgs []schema.Message) *editor {
	return &editor{msgs: append([]schema.Message(nil), msgs...)}
}

// insertAt places m at index i (len(msgs) appends).
func (e *editor) insertAt(i int, m schema.Message) {
	before := ""
	if i < len(e.msgs) {
		before = e.msgs[i].ID
	}
	e.msgs = append(e.msgs, schema.Message{})
	copy(e.msgs[i+1:], e.msgs[i:])
	e.msgs[i] = m
	e.ch.Insert = append(e.ch.Insert, schema.Insertion{Message: m, Before: before})
}

// tagAt sets (or with "" clears) a parent tag on the message at index i.
func (e *editor) tagAt(i int, f schema.TagField, v string) {
	m := &e.msgs[i]
	switch f {
	case schema.TagCondenseParent:
		m.CondenseParent = v
	case schema.TagTruncationParent:
		m.TruncationParent = v
	}
	e.ch.Tags = append(e.ch.Tags, schema.TagChange{MessageID: m.ID, Field: f, Value: v})
}

// deleteWhere removes the messages for which drop is true (rewind only).
func (e *editor) deleteWhere(drop func(*schema.Message) bool) {
	kept := e.msgs[:0]
	for i := range e.msgs {
		if drop(&e.msgs[i]) {
			e.ch.Delete = append(e.ch.Delete, e.msgs[i].ID)
			continue
		}
		kept = append(kept, e.msgs[i])
	}
	e.msgs = kept
}

// changes returns the recorded edits.
func (e *editor) changes() schema.Changes { return e.ch }

// Apply replays changes on a history and returns the new history. It is what
// the store does in SQL for each Changes in turn: deletes, then inserts (each
// before the named message, or at the end), then tag changes. The history is
// copied once, however many Changes are replayed: a lane batch replays every
// turn it holds before a condense reads the history.
func Apply(msgs []schema.Message, chs ...*schema.Changes) []schema.Message {
	inserts := 0
	for _, ch := range chs {
		inserts += len(ch.Insert)
	}
	// Always copy: callers keep their slice, as with every function here.
	out := make([]schema.Message, len(msgs), len(msgs)+inserts)
	copy(out, msgs)
	for _, ch := range chs {
		out = applyInPlace(out, ch)
	}
	return out
}

// applyInPlace is Apply of one Changes over a history the caller owns.
func applyInPlace(out []schema.Message, ch *schema.Changes) []schema.Message {
	if len(ch.Delete) > 0 {
		gone := make(map[string]bool, len(ch.Delete))
		for _, id := range ch.Delete {
			gone[id] = true
		}
		kept := out[:0]
		for _, m := range out {
			if !gone[m.ID] {
				kept = append(kept, m)
			}
		}
		clear(out[len(kept):]) // no stale copies beyond the length
		out = kept
	}
	for _, ins := range ch.Insert {
		i := len(out)
		if ins.Before != "" {
			for j := range out {
				if out[j].ID == ins.Before {
					i = j
					break
				}
			}
		}
		out = append(out, schema.Message{})
		copy(out[i+1:], out[i:])
		out[i] = ins.Message
	}
	if len(ch.Tags) > 0 {
		idx := make(map[string]int, len(out))
		for i := range out {
			idx[out[i].ID] = i
		}
		for _, t := range ch.Tags {
			i, ok := idx[t.MessageID]
			if !ok {
				continue
			}
			if t.Field == schema.TagCondenseParent {
				out[i].CondenseParent = t.Value
			} else {
				out[i].TruncationParent = t.Value
			}
		}
	}
	return out
}
