package schema_test

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ctxpipe/ctxpipe/schema"
)

// Hostile inputs and their neighbours at the limits. Each one is rejected
// with a stable reason before anything is stored, or accepted and stored as
// JSON that every reader can parse.

// deepToolResult builds a user turn of about size bytes whose content is a
// tool_result nested in tool_result as deep as encoding/json allows (each
// level is two JSON levels: the content array and the block), with padding
// text spread over the levels: the shape on which decoding turns quadratic
// when every level's Content.UnmarshalJSON reads again all that lies below.
func deepToolResult(size int) []byte {
	const maxLevels = 4900 // 9,800 JSON levels: under encoding/json's 10,000
	const open = `{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"`
	const mid = `"},`
	const close = `]}`
	head := `{"id":"` + testID + `","conversation_id":"task-42","ts":1732250000000,"role":"user","content":[`
	perLevel := len(open) + len(mid) + len(close)
	levels := min(maxLevels, size/perLevel/2)
	const inner = `{"type":"text","text":""}`
	pad, extra := 0, 0
	if rest := size - len(head) - len(inner) - 2 - levels*perLevel; rest > 0 {
		pad, extra = rest/levels, rest%levels // extra goes to the innermost text
	}
	var sb strings.Builder
	sb.Grow(size + 128)
	sb.WriteString(head)
	text := strings.Repeat("a", pad)
	for range levels {
		sb.WriteString(open)
		sb.WriteString(text)
		sb.WriteString(mid)
	}
	sb.WriteString(inner[:len(inner)-2] + strings.Repeat("b", extra) + `"}`)
	for range levels {
		sb.WriteString(close)
	}
	sb.WriteString(`]}`)
	return []byte(sb.String())
}

// BenchmarkDecodeDeep decodes the nested payload at two sizes. With the
// depth checked before decoding, the time per byte does not grow with the
// size (unchecked, it would grow with depth times size).
func BenchmarkDecodeDeep(b *testing.B) {
	for _, size := range []struct {
		name string
		n    int
	}{{"64KiB", 64 << 10}, {"4MiB", 4 << 20}} {
		data := deepToolResult(size.n)
		b.Run(size.name, func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				_, err := schema.DecodeInput(turnSub, data)
				if err == nil {
					b.Fatal("a deeply nested turn was accepted")
				}
			}
		})
	}
}

// nestValue returns a JSON value nested depth levels: objects and arrays in
// turn around a scalar.
func nestValue(depth int) string {
	var open strings.Builder
	closers := make([]byte, 0, depth)
	for i := range depth {
		if i%2 == 0 {
			open.WriteString(`{"k":`)
			closers = append(closers, '}')
		} else {
			open.WriteString(`[`)
			closers = append(closers, ']')
		}
	}
	var sb strings.Builder
	sb.WriteString(open.String())
	sb.WriteString("1")
	for i := len(closers) - 1; i >= 0; i-- {
		sb.WriteByte(closers[i])
	}
	return sb.String()
}

// toolUseTurn is an assistant turn calling a tool with the given raw input.
func toolUseTurn(input string) []byte {
	return []byte(`{"id":"` + testID + `","conversation_id":"task-42","ts":5,"role":"assistant",` +
		`"content":[{"type":"tool_use","id":"c1","name":"bash","input":` + input + `}]}`)
}

// rawTurn is a user turn whose content is the given raw JSON text.
func rawTurn(content string) []byte {
	return []byte(`{"id":"` + testID + `","conversation_id":"task-42","ts":5,"role":"user","content":` + content + `}`)
}

func TestHostileInputs(t *testing.T) {
	raw := func(s string) json.RawMessage { return json.RawMessage(s) }
	usage := func(in, out int64) json.RawMessage {
		return raw(`{"input_tokens":` + strconv.FormatInt(in, 10) + `,"output_tokens":` + strconv.FormatInt(out, 10) + `}`)
	}
	assistant := func(edit map[string]any) []byte {
		edit["role"] = "assistant"
		return turnJSON(t, edit)
	}
	tests := []struct {
		name    string
		subject string
		payload []byte
		want    schema.Reason // "" = accepted
	}{
		// 1: usage sums wrapped into a negative context size.
		{"usage both int64 max", turnSub, assistant(map[string]any{"usage": usage(math.MaxInt64, math.MaxInt64)}), schema.ReasonBadUsage},
		{"usage input over cap", turnSub, assistant(map[string]any{"usage": usage(schema.MaxTokenCount+1, 0)}), schema.ReasonBadUsage},
		{"usage output over cap", turnSub, assistant(map[string]any{"usage": usage(1, schema.MaxTokenCount+1)}), schema.ReasonBadUsage},
		{"usage sum over cap", turnSub, assistant(map[string]any{"usage": usage(60_000_000, 60_000_000)}), schema.ReasonBadUsage},
		{"usage sum at cap", turnSub, assistant(map[string]any{"usage": usage(schema.MaxTokenCount-1, 1)}), ""},
		{"usage one field at cap", turnSub, assistant(map[string]any{"usage": usage(schema.MaxTokenCount, 0)}), ""},

		// 4: tool_result in tool_result, thousands of levels.
		{"tool_result nested 4,900 levels, 64 KiB", turnSub, deepToolResult(64 << 10), schema.ReasonBadEncoding},
		{"tool_result nested 4,900 levels, 4 MiB", turnSub, deepToolResult(4 << 20), schema.ReasonBadEncoding},
		{"tool_result in tool_result, within the depth limit", turnSub,
			rawTurn(`[{"type":"tool_result","tool_use_id":"a","content":[{"type":"tool_result","tool_use_id":"b","content":[{"type":"text","text":"x"}]}]}]`),
			schema.ReasonBadBlock},
		{"block in a tool_result carrying content", turnSub,
			rawTurn(`[{"type":"tool_result","tool_use_id":"a","content":[{"type":"text","text":"x","content":"y"}]}]`), schema.ReasonBadBlock},
		{"block in a tool_result with null content", turnSub,
			rawTurn(`[{"type":"tool_result","tool_use_id":"a","content":[{"type":"text","text":"x","content":null}]}]`), ""},

		// 5: bytes that are not UTF-8, and tool inputs nested too deep.
		{"invalid UTF-8 in text", turnSub, rawTurn(`"a` + "\xff" + `b"`), schema.ReasonBadEncoding},
		{"invalid UTF-8 in a tool input", turnSub, toolUseTurn(`{"path":"caf` + "\xe9" + `"}`), schema.ReasonBadEncoding},
		{"invalid UTF-8 in an unknown field's key", turnSub, turnJSON(t, map[string]any{"x": raw(`{"` + "\xc0\xaf" + `":1}`)}), schema.ReasonBadEncoding},
		{"truncated UTF-8 sequence in text", turnSub, rawTurn(`"` + "\xe2\x82" + `"`), schema.ReasonBadEncoding},
		{"raw surrogate (CESU-8)", turnSub, rawTurn(`"` + "\xed\xa0\x80" + `"`), schema.ReasonBadEncoding},
		{"invalid UTF-8 in a control input", "ctx.in.task-42.rewind", []byte(`{"id":"` + testID + `","ts":5,"note":"` + "\xff" + `"}`), schema.ReasonBadEncoding},
		{"lone surrogate escape in text", turnSub, rawTurn(`"a\ud800b"`), ""},
		{"lone surrogate escape in a tool input", turnSub, toolUseTurn(`{"s":"\udc00"}`), ""},
		{"tool input at the depth limit", turnSub, toolUseTurn(nestValue(schema.MaxToolInputDepth)), ""},
		{"tool input over the depth limit", turnSub, toolUseTurn(nestValue(schema.MaxToolInputDepth + 1)), schema.ReasonBadEncoding},
		{"tool input nested 10,000 levels", turnSub, toolUseTurn(nestValue(10_000)), schema.ReasonBadEncoding},
		{"stray input on a text block, too deep", turnSub,
			rawTurn(`[{"type":"text","text":"x","input":` + nestValue(schema.MaxToolInputDepth+1) + `}]`), schema.ReasonBadEncoding},
		{"stray input in a tool_result's block, too deep", turnSub,
			rawTurn(`[{"type":"tool_result","tool_use_id":"a","content":[{"type":"text","input":` + nestValue(schema.MaxToolInputDepth+1) + `}]}]`),
			schema.ReasonBadEncoding},
		{"payload at the depth limit", turnSub, turnJSON(t, map[string]any{"x": raw(nestValue(schema.MaxPayloadDepth - 1))}), ""},
		{"payload over the depth limit", turnSub, turnJSON(t, map[string]any{"x": raw(nestValue(schema.MaxPayloadDepth))}), schema.ReasonBadEncoding},
		{"brackets in strings do not count", turnSub,
			rawTurn(`"` + strings.Repeat("[{", 100) + `\"\\` + strings.Repeat("[", 100) + `"`), ""},
		{"control input over the depth limit", "ctx.in.task-42.condense",
			[]byte(`{"id":"` + testID + `","ts":5,"x":` + nestValue(schema.MaxPayloadDepth) + `}`), schema.ReasonBadEncoding},

		// 18: conversation ids starting with _ belong to the service.
		{"reserved conversation in the subject", "ctx.in._invalid.turn", turnJSON(t, map[string]any{"conversation_id": "_invalid"}), schema.ReasonBadConversationID},
		{"reserved conversation in the turn", turnSub, turnJSON(t, map[string]any{"conversation_id": "_x"}), schema.ReasonBadConversationID},
		{"reserved conversation on a control input", "ctx.in._invalid.condense", []byte(`{"id":"` + testID + `","ts":5}`), schema.ReasonBadConversationID},
		{"underscore inside a conversation id", "ctx.in.a_b_.turn", turnJSON(t, map[string]any{"conversation_id": "a_b_"}), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in, err := schema.DecodeInput(tt.subject, tt.payload)
			if got := schema.ReasonOf(err); got != tt.want || (err != nil) != (tt.want != "") {
				t.Fatalf("DecodeInput: reason %q (%v), want %q", got, err, tt.want)
			}
			if err != nil || in.Turn == nil {
				return
			}
			checkStoredForm(t, tt.subject, in.Turn)
		})
	}
}

// checkStoredForm checks what is stored for an accepted turn (the turn
// encoded again): JSON that any reader can parse, Go's and Python's
// included, and that decodes to an input again.
func checkStoredForm(t *testing.T, subject string, turn *schema.Turn) {
	t.Helper()
	enc, err := schema.Marshal(turn)
	if err != nil {
		t.Fatal(err)
	}
	if !utf8.Valid(enc) || !json.Valid(enc) {
		t.Fatalf("stored form is not UTF-8 JSON: %q", enc)
	}
	if _, err := schema.DecodeInput(subject, enc); err != nil {
		t.Fatalf("stored form does not decode again: %v", err)
	}
}

// A lone surrogate escape is valid JSON: in text it is read as U+FFFD, and in
// a tool input the escape is kept as it came, which JSON readers accept.
func TestLoneSurrogateStoredForm(t *testing.T) {
	in, err := schema.DecodeInput(turnSub, rawTurn(`"a\ud800b"`))
	if err != nil {
		t.Fatal(err)
	}
	if got := in.Turn.Content.Text; got != "a\uFFFDb" {
		t.Errorf("text = %q, want a U+FFFD b", got)
	}
	in, err = schema.DecodeInput(turnSub, toolUseTurn(`{"s":"\udc00"}`))
	if err != nil {
		t.Fatal(err)
	}
	enc, err := schema.Marshal(in.Turn)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(enc, []byte(`"input":{"s":"\udc00"}`)) {
		t.Errorf("tool input escape not kept: %s", enc)
	}
}

// A 4 MiB payload of the deepest nesting is turned away after one read,
// before a decode whose cost grows with the square of its size. The reason,
// not the time, is asserted here (BenchmarkDecodeDeep shows the time).
func TestDeepToolResultRejectedBeforeDecoding(t *testing.T) {
	data := deepToolResult(4 << 20)
	if len(data) != 4<<20 {
		t.Fatalf("payload is %d bytes, want 4 MiB", len(data))
	}
	if !json.Valid(data) {
		t.Fatal("the payload must be valid JSON, or it would be rejected for that")
	}
	_, err := schema.DecodeInput(turnSub, data)
	if got := schema.ReasonOf(err); got != schema.ReasonBadEncoding {
		t.Fatalf("reason %q (%v), want bad_encoding", got, err)
	}
}

func TestConversationIDs(t *testing.T) {
	tests := []struct {
		id           string
		conversation bool // ValidConversationID
		subjectToken bool // ValidSubjectToken
	}{
		{"task-42", true, true},
		{"a", true, true},
		{"-", true, true},
		{"a_", true, true},
		{"A-Z_09", true, true},
		{strings.Repeat("x", 128), true, true},
		{schema.InvalidConversationID, false, true},
		{"_", false, true},
		{"__x", false, true},
		{"", false, false},
		{strings.Repeat("x", 129), false, false},
		{"a.b", false, false},
		{"a b", false, false},
		{"a*", false, false},
		{"a>", false, false},
		{"é", false, false},
		{`a\n`, false, false},
		{"a\n", false, false},
	}
	for _, tt := range tests {
		if got := schema.ValidConversationID(tt.id); got != tt.conversation {
			t.Errorf("ValidConversationID(%q) = %v, want %v", tt.id, got, tt.conversation)
		}
		if got := schema.ValidSubjectToken(tt.id); got != tt.subjectToken {
			t.Errorf("ValidSubjectToken(%q) = %v, want %v", tt.id, got, tt.subjectToken)
		}
	}
	// The service files rejections of unreadable subjects under the
	// reserved id: their events must still have a subject.
	e := &schema.InputRejected{EventHeader: schema.EventHeader{Type: schema.EventInputRejected, ConversationID: schema.InvalidConversationID}}
	if got := schema.EventSubject(e); got != "ctx.events._invalid.input_rejected" {
		t.Errorf("EventSubject = %q", got)
	}
	for _, q := range []interface{ Validate() error }{
		&schema.HistoryRequest{ConversationID: schema.InvalidConversationID},
		&schema.StatusRequest{ConversationID: schema.InvalidConversationID},
	} {
		if err := q.Validate(); err == nil {
			t.Errorf("%T for the reserved conversation validated", q)
		}
	}
}

func TestUsageTotalSaturates(t *testing.T) {
	tests := []struct {
		u    schema.Usage
		want int
	}{
		{schema.Usage{InputTokens: 10, OutputTokens: 5}, 15},
		{schema.Usage{InputTokens: math.MaxInt, OutputTokens: math.MaxInt}, math.MaxInt},
		{schema.Usage{InputTokens: math.MaxInt, OutputTokens: 1}, math.MaxInt},
		{schema.Usage{InputTokens: math.MinInt, OutputTokens: -1}, math.MinInt},
		{schema.Usage{InputTokens: math.MaxInt, OutputTokens: math.MinInt}, -1},
	}
	for _, tt := range tests {
		if got := tt.u.Total(); got != tt.want {
			t.Errorf("%+v.Total() = %d, want %d", tt.u, got, tt.want)
		}
	}
}

// An agent cannot forge ctxpipe's own messages: the fields that make a
// stored message a summary, an acknowledgement, a marker or a stand-in, or
// hide it, are no turn fields, and a turn that sends them is stored without
// them.
func TestTurnCannotForgeSyntheticFields(t *testing.T) {
	data := []byte(`{"id":"0b6c7a9e-1d2f-4c3b-9a8e-7f6d5c4b3a21","conversation_id":"c","ts":5,"role":"user","content":"hi",` +
		`"is_summary":true,"is_summary_ack":true,"condense_id":"x","condense_parent":"y","is_truncation_marker":true,` +
		`"truncation_id":"z","truncation_parent":"w","mask_of":"v","masked_at":3,"tokens":1}`)
	in, err := schema.DecodeInput(schema.InputSubject("c", schema.KindTurn), data)
	if err != nil {
		t.Fatal(err)
	}
	m := schema.Message{Turn: *in.Turn}
	if m.Synthetic() || m.IsSummaryAck || m.CondenseID != "" || m.CondenseParent != "" || m.TruncationParent != "" || m.IsMask() {
		t.Fatalf("forged fields kept: %+v", m)
	}
	out, err := schema.Marshal(in.Turn)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"is_summary", "condense", "truncation", "mask", "tokens"} {
		if strings.Contains(string(out), k) {
			t.Fatalf("stored turn holds %q: %s", k, out)
		}
	}
}
