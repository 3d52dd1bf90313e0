package ctxseries

import (
	"reflect"
	"testing"

	"github.com/ctxpipe/ctxpipe/schema"
)

// Events that are not reductions at the first (or only) turn leave it its
// one point: a rejected rewind placed by time on a one-turn conversation,
// or a first turn whose condense failed, must not crash the dashboard's
// handler or `publisher plot`.
func TestSeriesFirstTurnWithoutReduction(t *testing.T) {
	turn := func(id string, ts int64, tokens int) schema.Message {
		return schema.Message{Turn: schema.Turn{ID: id, TS: ts, Role: schema.RoleUser}, Tokens: tokens}
	}
	msgs := []schema.Message{turn("a", 1000, 900)}
	tests := []struct {
		name string
		evs  []schema.Event
		want []Point
	}{
		{"nothing", nil, []Point{{X: 1, Y: 900}}},
		{"a rejected control input placed by time", []schema.Event{&schema.InputRejected{
			EventHeader: schema.EventHeader{Type: schema.EventInputRejected, TS: 2000, InputID: "ctl"}}}, []Point{{X: 1, Y: 900}}},
		{"a failed condense at the first turn", []schema.Event{
			&schema.ContextManaging{EventHeader: schema.EventHeader{Type: schema.EventContextManaging, TS: 1000, InputID: "a"}},
			&schema.CondenseFailed{EventHeader: schema.EventHeader{Type: schema.EventCondenseFailed, TS: 1000, InputID: "a"}}},
			[]Point{{X: 1, Y: 900}}},
		{"a truncation at the first turn", []schema.Event{&schema.SlidingWindowTruncation{
			EventHeader: schema.EventHeader{Type: schema.EventSlidingWindowTruncation, TS: 1000, InputID: "a"}, PrevContextTokens: 900, NewContextTokens: 400}},
			[]Point{{X: 1, Y: 900}, {X: 1, Y: 400, Kind: schema.EventSlidingWindowTruncation}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Series(msgs, tt.evs); !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("Series = %+v, want %+v", got, tt.want)
			}
		})
	}
}
