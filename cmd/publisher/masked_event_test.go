package main

import (
	"reflect"
	"strings"
	"testing"

	"github.com/ctxpipe/ctxpipe/internal/ctxseries"
	"github.com/ctxpipe/ctxpipe/schema"
)

// tool_results_masked in follow and plot.
func TestFollowShowsMasking(t *testing.T) {
	checkFormat(t, []formatCase{
		{&schema.ToolResultsMasked{EventHeader: header(schema.EventToolResultsMasked), MaskID: "m", Count: 12, MessagesMasked: 9,
			PrevContextTokens: 22400, NewContextTokens: 9100, Trigger: schema.TriggerAuto},
			"12:01:02 task-42 tool_results_masked 22,400→9,100 tokens (12 tool results in 9 msgs, auto) input 0b6c7a9e"},
		{&schema.Rewind{EventHeader: header(schema.EventRewind), CutoffTS: formatTS, MessagesRestored: 9, RemovedMaskIDs: []string{"m"}},
			"12:01:02 task-42 rewind to 12:01:02.000 (0 msgs removed, 9 restored, 0 condenses and 0 truncations undone, 1 maskings undone) input 0b6c7a9e"},
		{&schema.CondenseContext{EventHeader: header(schema.EventCondenseContext), PrevContextTokens: 9000, NewContextTokens: 3000,
			MessagesCondensed: 4, Trigger: schema.TriggerManual, Instructions: "keep the failing\ntest names"},
			`12:01:02 task-42 condense_context 9,000→3,000 tokens (4 msgs, manual, $0.0000) instructions "keep the failing test names" input 0b6c7a9e`},
	})
}

func TestPlotShowsMasking(t *testing.T) {
	turn := func(id string, ts int64, tokens int) schema.Message {
		return schema.Message{Turn: schema.Turn{ID: id, TS: ts, Role: schema.RoleUser}, Tokens: tokens}
	}
	msgs := []schema.Message{
		turn("a", 10, 100),
		turn("b", 20, 900),
		{Turn: schema.Turn{ID: "b-masked", TS: 20, Role: schema.RoleUser}, IsSummary: true, CondenseID: "m", MaskOf: "b", MaskedAt: 30, Tokens: 20}, // not a turn
		turn("c", 30, 500),
	}
	evs := []schema.Event{
		&schema.ToolResultsMasked{EventHeader: schema.EventHeader{Type: schema.EventToolResultsMasked, InputID: "c", TS: 30}, MaskID: "m", PrevContextTokens: 1500, NewContextTokens: 620},
		&schema.ToolResultsMasked{EventHeader: schema.EventHeader{Type: schema.EventToolResultsMasked, InputID: "c", TS: 30}, MaskID: "gone", PrevContextTokens: 9, NewContextTokens: 8},
		&schema.Rewind{EventHeader: schema.EventHeader{Type: schema.EventRewind, TS: 60}, RemovedMaskIDs: []string{"gone"}},
	}
	want := []ctxseries.Point{{X: 1, Y: 100}, {X: 2, Y: 1000}, {X: 3, Y: 1500}, {X: 3, Y: 620, Kind: schema.EventToolResultsMasked}}
	pts := ctxseries.Series(msgs, evs)
	if !reflect.DeepEqual(pts, want) {
		t.Fatalf("series\n got %+v\nwant %+v", pts, want)
	}
	var b strings.Builder
	if err := renderSVG(&b, schema.StatusReply{ConversationID: "c", ContextWindow: 2000, Threshold: 70}, pts); err != nil {
		t.Fatal(err)
	}
	if strings.Count(b.String(), "<polygon") != 2 || !strings.Contains(b.String(), "masking (1)") || !strings.Contains(b.String(), "masking at turn 3") {
		t.Fatalf("no masking marker and legend in:\n%s", b.String())
	}
}
