package main

import (
	"encoding/xml"
	"reflect"
	"strings"
	"testing"

	"github.com/ctxpipe/ctxpipe/internal/ctxseries"
	"github.com/ctxpipe/ctxpipe/schema"
)

func TestContextSeries(t *testing.T) {
	turn := func(id string, ts int64, tokens int) schema.Message {
		return schema.Message{Turn: schema.Turn{ID: id, TS: ts, Role: schema.RoleUser}, Tokens: tokens}
	}
	msgs := []schema.Message{
		turn("a", 10, 100),
		{Turn: schema.Turn{ID: "s", TS: 19}, IsSummary: true, CondenseID: "c", Tokens: 30}, // not a turn
		turn("b", 20, 200),
		turn("c", 30, 300),
		turn("d", 40, 50),
	}
	msgs[3].Usage = &schema.Usage{InputTokens: 900, OutputTokens: 10}
	evs := []schema.Event{
		&schema.ContextManaging{EventHeader: schema.EventHeader{Type: schema.EventContextManaging, InputID: "b"}},
		&schema.CondenseContext{EventHeader: schema.EventHeader{Type: schema.EventCondenseContext, InputID: "b"}, PrevContextTokens: 320, NewContextTokens: 150},
		// a manual condense at ts 45 belongs to the last turn before it
		&schema.SlidingWindowTruncation{EventHeader: schema.EventHeader{Type: schema.EventSlidingWindowTruncation, InputID: "ctl", TS: 45}, PrevContextTokens: 970, NewContextTokens: 400},
		// a condense a later rewind undid is not drawn
		&schema.CondenseContext{EventHeader: schema.EventHeader{Type: schema.EventCondenseContext, InputID: "gone", TS: 50}, CondenseID: "x", PrevContextTokens: 1, NewContextTokens: 1},
		&schema.Rewind{EventHeader: schema.EventHeader{Type: schema.EventRewind, TS: 60}, RemovedCondenseIDs: []string{"x"}},
	}
	got := ctxseries.Series(msgs, evs)
	want := []ctxseries.Point{
		{X: 1, Y: 100},
		{X: 2, Y: 320}, {X: 2, Y: 150, Kind: schema.EventCondenseContext},
		{X: 3, Y: 910}, // the provider's usage replaces the running count
		{X: 4, Y: 970}, {X: 4, Y: 400, Kind: schema.EventSlidingWindowTruncation},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("series\n got %+v\nwant %+v", got, want)
	}
}

func TestRenderSVGIsWellFormed(t *testing.T) {
	st := schema.StatusReply{ConversationID: "demo", ProfileID: "p<&>", ContextWindow: 16000, AllowedTokens: 13376, Threshold: 60}
	pts := []ctxseries.Point{{X: 1, Y: 100}, {X: 2, Y: 9700}, {X: 2, Y: 3000, Kind: schema.EventCondenseContext}, {X: 3, Y: 14000}, {X: 3, Y: 7000, Kind: schema.EventSlidingWindowTruncation}}
	var b strings.Builder
	if err := renderSVG(&b, st, pts); err != nil {
		t.Fatal(err)
	}
	d := xml.NewDecoder(strings.NewReader(b.String()))
	circles, rects, polylines := 0, 0, 0
	for {
		tok, err := d.Token()
		if err != nil {
			if err.Error() == "EOF" {
				break
			}
			t.Fatalf("not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			switch se.Name.Local {
			case "circle":
				circles++
			case "rect":
				rects++
			case "polyline":
				polylines++
			}
		}
	}
	// one condense marker + the legend's; background + one truncation marker + the legend's
	if circles != 2 || rects != 3 || polylines != 1 {
		t.Fatalf("circles %d rects %d polylines %d", circles, rects, polylines)
	}
	if !strings.Contains(b.String(), "condense (1)") || !strings.Contains(b.String(), "truncation (1)") {
		t.Fatal("legend counts missing")
	}
}
