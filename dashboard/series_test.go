package dashboard_test

import (
	"slices"
	"testing"

	"github.com/ctxpipe/ctxpipe/dashboard"
	"github.com/ctxpipe/ctxpipe/schema"
)

func msg(id string, ts int64, tokens int) schema.Message {
	return schema.Message{Turn: schema.Turn{ID: id, TS: ts, Role: schema.RoleUser, Content: schema.TextContent(id)}, Tokens: tokens}
}

// A summary hidden by a later one nests under it; a truncation marker
// hides what it removed; the effective flags are the engine's.
func TestHistoryNesting(t *testing.T) {
	t1, t2, t3, t4, t5, t6 := msg("t1", 1, 10), msg("t2", 2, 10), msg("t3", 3, 10), msg("t4", 4, 10), msg("t5", 5, 10), msg("t6", 6, 10)
	s1 := msg("s1", 4, 5)
	s1.IsSummary, s1.CondenseID, s1.Role = true, "c1", schema.RoleAssistant
	s2 := msg("s2", 5, 5)
	s2.IsSummary, s2.CondenseID, s2.Role = true, "c2", schema.RoleUser
	// preserve_fraction's acknowledgement after its summary: what the
	// condense hid is hidden by the summary, not by it.
	a2 := msg("a2", 5, 5)
	a2.IsSummary, a2.IsSummaryAck, a2.CondenseID, a2.Role = true, true, "c2", schema.RoleAssistant
	t2.CondenseParent, t3.CondenseParent = "c1", "c1"
	s1.CondenseParent, t4.CondenseParent = "c2", "c2"
	m := msg("m", 6, 1)
	m.IsTruncationMarker, m.TruncationID = true, "tr1"
	t5.TruncationParent = "tr1"
	// A tag naming a summary that is gone (a rewind removed it) hides nothing.
	t6.CondenseParent = "gone"
	items, hidden := dashboard.History([]schema.Message{t1, t2, t3, s1, t4, s2, a2, m, t5, t6})
	got := map[string]string{}
	var effective []string
	for _, it := range items {
		got[it.ID] = it.Kind + ">" + it.HiddenBy
		if it.Effective {
			effective = append(effective, it.ID)
		}
	}
	want := map[string]string{"t1": "turn>", "t2": "turn>s1", "t3": "turn>s1", "s1": "summary>s2", "t4": "turn>s2",
		"s2": "summary>", "a2": "ack>", "m": "marker>", "t5": "turn>m", "t6": "turn>"}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("%s: %s, want %s", id, got[id], w)
		}
	}
	if hidden != 5 || !slices.Equal(effective, []string{"t1", "s2", "a2", "m", "t6"}) {
		t.Fatalf("hidden %d, effective %v", hidden, effective)
	}
}

// The series counts each turn, drops at each condense or truncation by the
// event's own figures, and leaves out what a rewind undid.
func TestSeries(t *testing.T) {
	msgs := []schema.Message{msg("a", 1000, 100), msg("b", 2000, 100), msg("c", 3000, 100), msg("d", 4000, 100)}
	s := msg("s", 2500, 30)
	s.IsSummary, s.CondenseID = true, "c1"
	msgs = append(msgs, s)
	hdr := func(typ schema.EventType, input string, ts int64) schema.EventHeader {
		return schema.EventHeader{ID: input + string(typ), Type: typ, InputID: input, TS: ts}
	}
	evs := []schema.Event{
		&schema.ContextManaging{EventHeader: hdr(schema.EventContextManaging, "b", 2000)},
		&schema.CondenseContext{EventHeader: hdr(schema.EventCondenseContext, "b", 2000), CondenseID: "c1", PrevContextTokens: 200, NewContextTokens: 80},
		// A manual condense: placed by time, after turn c.
		&schema.CondenseContext{EventHeader: hdr(schema.EventCondenseContext, "manual", 3500), CondenseID: "c2", PrevContextTokens: 180, NewContextTokens: 90},
		&schema.SlidingWindowTruncation{EventHeader: hdr(schema.EventSlidingWindowTruncation, "d", 4000), TruncationID: "tr1", PrevContextTokens: 190, NewContextTokens: 120},
		// The rewind undid the manual condense.
		&schema.Rewind{EventHeader: hdr(schema.EventRewind, "r", 5000), RemovedCondenseIDs: []string{"c2"}},
	}
	got := dashboard.Series(msgs, evs)
	want := []dashboard.Point{
		{X: 1, Y: 100},
		{X: 2, Y: 200}, {X: 2, Y: 80, Kind: schema.EventCondenseContext},
		{X: 3, Y: 180},
		{X: 4, Y: 190}, {X: 4, Y: 120, Kind: schema.EventSlidingWindowTruncation},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("series\n%v\nwant\n%v", got, want)
	}
}
