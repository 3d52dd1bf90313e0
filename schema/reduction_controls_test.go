package schema_test

import (
	"strings"
	"testing"

	"github.com/ctxpipe/ctxpipe/schema"
)

// Pin inputs and a manual condense's instructions decode, or are rejected
// with their reason.
func TestDecodePinAndInstructions(t *testing.T) {
	const (
		id  = "0b6c7a9e-4f0e-4a7b-9a51-2f1c3d4e5f60"
		msg = "1b6c7a9e-4f0e-4a7b-9a51-2f1c3d4e5f61"
	)
	head := `{"id":"` + id + `","ts":1732250000000`
	long := strings.Repeat("é", schema.MaxInstructionsLen)
	tests := []struct {
		name, subject, payload string
		want                   schema.Reason // "" = accepted
		check                  func(t *testing.T, in schema.Input)
	}{
		{"pin", "ctx.in.c1.pin", head + `,"message_id":"` + msg + `","pinned":true}`, "", func(t *testing.T, in schema.Input) {
			if in.Kind != schema.KindPin || in.MessageID != msg || !in.Pinned {
				t.Errorf("got %+v", in)
			}
		}},
		{"unpin", "ctx.in.c1.pin", head + `,"message_id":"` + msg + `","pinned":false}`, "", func(t *testing.T, in schema.Input) {
			if in.Pinned || in.ConversationID != "c1" {
				t.Errorf("got %+v", in)
			}
		}},
		{"pin without pinned", "ctx.in.c1.pin", head + `,"message_id":"` + msg + `"}`, schema.ReasonInvalidJSON, nil},
		{"pin without message", "ctx.in.c1.pin", head + `,"pinned":true}`, schema.ReasonUnknownTarget, nil},
		{"pin of a non-id", "ctx.in.c1.pin", head + `,"message_id":"first","pinned":true}`, schema.ReasonUnknownTarget, nil},
		{"pinned on a condense", "ctx.in.c1.condense", head + `,"pinned":true}`, schema.ReasonInvalidJSON, nil},
		{"instructions", "ctx.in.c1.condense", head + `,"instructions":"keep the failing test names"}`, "", func(t *testing.T, in schema.Input) {
			if in.Instructions != "keep the failing test names" || in.Trigger != schema.TriggerManual {
				t.Errorf("got %+v", in)
			}
		}},
		{"instructions at the bound", "ctx.in.c1.condense", head + `,"instructions":"` + long + `"}`, "", nil},
		{"instructions over the bound", "ctx.in.c1.condense", head + `,"instructions":"` + long + `x"}`, schema.ReasonBadInstructions, nil},
		{"instructions on a rewind", "ctx.in.c1.rewind", head + `,"instructions":"x"}`, schema.ReasonBadInstructions, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in, err := schema.DecodeInput(tt.subject, []byte(tt.payload))
			if got := schema.ReasonOf(err); got != tt.want || (err != nil) != (tt.want != "") {
				t.Fatalf("reason %q (%v), want %q", got, err, tt.want)
			}
			if err == nil && tt.check != nil {
				tt.check(t, in)
			}
			if err != nil {
				return
			}
			// The payload a client builds decodes to the same input.
			data, err := schema.ControlPayload(in)
			if err != nil {
				t.Fatal(err)
			}
			back, err := schema.DecodeInput(tt.subject, data)
			if err != nil || back.MessageID != in.MessageID || back.Pinned != in.Pinned || back.Instructions != in.Instructions {
				t.Errorf("round trip: %+v, %v; want %+v", back, err, in)
			}
		})
	}
}

func TestProfileMaskSettings(t *testing.T) {
	n := func(v int) *int { return &v }
	tests := []struct {
		name string
		p    schema.Profile
		ok   bool
		keep int
		gain int
		mask int
	}{
		{"defaults", schema.Profile{ID: "p", ContextWindow: 200000}, true, schema.DefaultMaskKeepLast, 1000, 1000},
		{"small window caps the gain at 5 %", schema.Profile{ID: "p", ContextWindow: 16000}, true, 3, 800, 800},
		{"set", schema.Profile{ID: "p", ContextWindow: 32000, MinGainTokens: n(0),
			Mask: schema.MaskSettings{Enabled: true, KeepLast: n(5), MinGainTokens: n(2000), ExcludeTools: []string{"read_file"}}}, true, 5, 0, 2000},
		{"negative keep_last", schema.Profile{ID: "p", ContextWindow: 32000, Mask: schema.MaskSettings{KeepLast: n(-1)}}, false, 0, 0, 0},
		{"negative min gain", schema.Profile{ID: "p", ContextWindow: 32000, MinGainTokens: n(-1)}, false, 0, 0, 0},
		{"huge mask min gain", schema.Profile{ID: "p", ContextWindow: 32000, Mask: schema.MaskSettings{MinGainTokens: n(schema.MaxTokenCount + 1)}}, false, 0, 0, 0},
		{"empty tool name", schema.Profile{ID: "p", ContextWindow: 32000, Mask: schema.MaskSettings{ExcludeTools: []string{""}}}, false, 0, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.p.Validate()
			if (err == nil) != tt.ok {
				t.Fatalf("Validate = %v, want ok=%v", err, tt.ok)
			}
			if !tt.ok {
				return
			}
			if g := tt.p.MaskKeepLast(); g != tt.keep {
				t.Errorf("MaskKeepLast = %d, want %d", g, tt.keep)
			}
			if g := tt.p.MinGain(); g != tt.gain {
				t.Errorf("MinGain = %d, want %d", g, tt.gain)
			}
			if g := tt.p.MaskMinGain(); g != tt.mask {
				t.Errorf("MaskMinGain = %d, want %d", g, tt.mask)
			}
			if !tt.p.KeepsTask() {
				t.Errorf("keep_task is on by default")
			}
		})
	}
}
