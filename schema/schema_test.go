package schema_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"unicode/utf8"

	"github.com/ctxpipe/ctxpipe/schema"
)

// transcriptDir is where the shared real transcripts live, relative to this
// package (CI checks out ../shared beside the repository).
const transcriptDir = "../../shared/data/transcripts"

const (
	testID  = "0b6c7a9e-4f0e-4a7b-9a51-2f1c3d4e5f60"
	turnSub = "ctx.in.task-42.turn"
)

func transcriptFiles(t testing.TB) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(transcriptDir, "*.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no transcripts in %s", transcriptDir)
	}
	return files
}

// turnJSON builds a turn payload from the fields that differ from a valid
// user turn; a nil value removes the field.
func turnJSON(t testing.TB, edit map[string]any) []byte {
	t.Helper()
	m := map[string]any{
		"id": testID, "conversation_id": "task-42", "ts": 1732250000000,
		"role": "user", "content": "hello",
	}
	for k, v := range edit {
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeInputReasons(t *testing.T) {
	raw := func(s string) json.RawMessage { return json.RawMessage(s) }
	tests := []struct {
		name    string
		subject string
		payload []byte
		want    schema.Reason
	}{
		{"not JSON", turnSub, []byte(`{"id":`), schema.ReasonInvalidJSON},
		{"array payload", turnSub, []byte(`[1]`), schema.ReasonInvalidJSON},
		{"string payload", turnSub, []byte(`"turn"`), schema.ReasonInvalidJSON},
		{"empty payload", turnSub, []byte(``), schema.ReasonInvalidJSON},
		{"trailing garbage", turnSub, append(turnJSON(t, nil), []byte(` {}`)...), schema.ReasonInvalidJSON},
		{"wrong field type", turnSub, turnJSON(t, map[string]any{"ts": "soon"}), schema.ReasonInvalidJSON},
		{"control not JSON", "ctx.in.task-42.rewind", []byte(`nope`), schema.ReasonInvalidJSON},
		{"control wrong type", "ctx.in.task-42.rewind", []byte(`{"id":"` + testID + `","ts":5,"include_target":"yes"}`), schema.ReasonInvalidJSON},
		{"not ctx.in", "ctx.out.task-42.turn", turnJSON(t, nil), schema.ReasonBadSubject},
		{"no kind", "ctx.in.task-42", turnJSON(t, nil), schema.ReasonBadSubject},
		{"extra token", "ctx.in.acme.task-42.turn.x", turnJSON(t, nil), schema.ReasonBadSubject},
		{"bad tenant", "ctx.in._acme.task-42.turn", turnJSON(t, nil), schema.ReasonBadSubject},
		{"tenant in the payload", "ctx.in.acme.task-42.turn", turnJSON(t, map[string]any{"conversation_id": "acme.task-42"}), schema.ReasonBadConversationID},
		{"subject conversation", "ctx.in.task 42.turn", turnJSON(t, nil), schema.ReasonBadConversationID},
		{"unknown kind", "ctx.in.task-42.delete", turnJSON(t, nil), schema.ReasonUnknownKind},
		{"missing id", turnSub, turnJSON(t, map[string]any{"id": nil}), schema.ReasonMissingID},
		{"control missing id", "ctx.in.task-42.overflow", []byte(`{"ts":5}`), schema.ReasonMissingID},
		{"bad id", turnSub, turnJSON(t, map[string]any{"id": "42"}), schema.ReasonBadID},
		{"control bad id", "ctx.in.task-42.condense", []byte(`{"id":"x","ts":5}`), schema.ReasonBadID},
		{"bad conversation id", turnSub, turnJSON(t, map[string]any{"conversation_id": "a/b"}), schema.ReasonBadConversationID},
		{"mismatch", "ctx.in.task-43.turn", turnJSON(t, nil), schema.ReasonConversationMismatch},
		{"control mismatch", "ctx.in.task-43.condense", []byte(`{"id":"` + testID + `","conversation_id":"task-42","ts":5}`), schema.ReasonConversationMismatch},
		{"ts zero", turnSub, turnJSON(t, map[string]any{"ts": 0}), schema.ReasonBadTS},
		{"control ts missing", "ctx.in.task-42.rewind", []byte(`{"id":"` + testID + `"}`), schema.ReasonBadTS},
		{"bad role", turnSub, turnJSON(t, map[string]any{"role": "tool"}), schema.ReasonBadRole},
		{"unknown block", turnSub, turnJSON(t, map[string]any{"content": raw(`[{"type":"video"}]`)}), schema.ReasonUnknownBlockType},
		{"untyped block", turnSub, turnJSON(t, map[string]any{"content": raw(`[{"text":"x"}]`)}), schema.ReasonUnknownBlockType},
		{"bad block", turnSub, turnJSON(t, map[string]any{"content": raw(`[{"type":"image"}]`)}), schema.ReasonBadBlock},
		{"bad usage", turnSub, turnJSON(t, map[string]any{"role": "assistant", "usage": raw(`{"input_tokens":-1,"output_tokens":0}`)}), schema.ReasonBadUsage},
		{"bad trigger", "ctx.in.task-42.condense", []byte(`{"id":"` + testID + `","ts":5,"trigger":"auto"}`), schema.ReasonBadTrigger},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in, err := schema.DecodeInput(tt.subject, tt.payload)
			if err == nil {
				t.Fatalf("accepted: %+v", in)
			}
			if got := schema.ReasonOf(err); got != tt.want {
				t.Errorf("reason = %q (%v), want %q", got, err, tt.want)
			}
			var se *schema.Error
			if !errors.As(err, &se) || se.Message == "" {
				t.Errorf("error %v is not an *Error with a message", err)
			}
		})
	}
}

func TestDecodeInputControl(t *testing.T) {
	tests := []struct {
		name    string
		subject string
		payload string
		want    schema.Input
	}{
		{"condense, no trigger", "ctx.in.c1.condense", `{"id":"` + testID + `","ts":7}`,
			schema.Input{Kind: schema.KindCondense, ID: testID, ConversationID: "c1", TS: 7, Trigger: schema.TriggerManual}},
		{"condense, manual", "ctx.in.c1.condense", `{"id":"` + testID + `","ts":7,"trigger":"manual"}`,
			schema.Input{Kind: schema.KindCondense, ID: testID, ConversationID: "c1", TS: 7, Trigger: schema.TriggerManual}},
		{"overflow is forced", "ctx.in.c1.overflow", `{"id":"` + testID + `","ts":8}`,
			schema.Input{Kind: schema.KindOverflow, ID: testID, ConversationID: "c1", TS: 8, Trigger: schema.TriggerForced}},
		{"rewind", "ctx.in.c1.rewind", `{"id":"` + testID + `","ts":9}`,
			schema.Input{Kind: schema.KindRewind, ID: testID, ConversationID: "c1", TS: 9}},
		{"rewind include target, matching conversation", "ctx.in.c1.rewind",
			`{"id":"` + testID + `","conversation_id":"c1","ts":9,"include_target":true,"extra":1}`,
			schema.Input{Kind: schema.KindRewind, ID: testID, ConversationID: "c1", TS: 9, IncludeTarget: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in, err := schema.DecodeInput(tt.subject, []byte(tt.payload))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(in, tt.want) {
				t.Errorf("got %+v, want %+v", in, tt.want)
			}
			// What ControlPayload writes decodes back to the same input.
			p, err := schema.ControlPayload(in)
			if err != nil {
				t.Fatal(err)
			}
			again, err := schema.DecodeInput(schema.InputSubject(in.ConversationID, in.Kind), p)
			if err != nil {
				t.Fatalf("ControlPayload output %s: %v", p, err)
			}
			if !reflect.DeepEqual(again, tt.want) {
				t.Errorf("ControlPayload round trip: got %+v, want %+v", again, tt.want)
			}
		})
	}
}

func TestDecodeInputTurn(t *testing.T) {
	in, err := schema.DecodeInput(turnSub, turnJSON(t, map[string]any{"profile_id": "claude", "agent_id": "coder"}))
	if err != nil {
		t.Fatal(err)
	}
	if in.Kind != schema.KindTurn || in.ID != testID || in.ConversationID != "task-42" || in.TS != 1732250000000 {
		t.Errorf("input header: %+v", in)
	}
	if in.Turn == nil || in.Turn.ProfileID != "claude" || in.Turn.AgentID != "coder" || in.Turn.Content.Text != "hello" {
		t.Errorf("turn: %+v", in.Turn)
	}
	if got := schema.PeekID(turnJSON(t, map[string]any{"role": "nobody"})); got != testID {
		t.Errorf("PeekID of a rejected turn = %q", got)
	}
	if got := schema.PeekID([]byte(`not json`)); got != "" {
		t.Errorf("PeekID of garbage = %q", got)
	}
}

// A payload that stops being JSON after its id is rejected under that id,
// not under one made from the stream sequence: wait_for on the id sent must
// see the rejection, and sending the same broken payload again must not
// make a second one.
func TestPeekIDOfBrokenPayloads(t *testing.T) {
	const id = "b6d23469-f65d-4c7b-9f3e-2a1d0c9b8a76"
	deep := strings.Repeat("[", 100_000)
	for _, c := range []struct {
		name, payload, want string
	}{
		{"a NUL byte in a later string", `{"id":"` + id + `","role":"user","content":"a` + "\x00" + `b"}`, id},
		{"a raw NUL byte in a later string", "{\"id\":\"" + id + "\",\"content\":\"a\x00b\"}", id},
		{"unterminated", `{"id":"` + id + `","role":"user","content":"abc`, id},
		{"unterminated object", `{"id":"` + id + `"`, id},
		{"nested 100,000 deep after the id", `{"id":"` + id + `","content":` + deep, id},
		{"nested deep before the id", `{"content":` + deep + `]], "id":"` + id + `"}`, ""},
		{"the id after other members", `{"role":"user","ts":1,"meta":{"id":"not-this"},"id":"` + id + `"}`, id},
		{"a name in other case", `{"ID":"` + id + `"}`, id},
		{"a repeated id keeps the last", `{"id":"first","id":"` + id + `"}`, id},
		{"an id that is not a string", `{"id":{"x":1}}`, ""},
		{"no id", `{"role":"user"}`, ""},
		{"an array", `["` + id + `"]`, ""},
		{"empty", ``, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := schema.PeekID([]byte(c.payload)); got != c.want {
				t.Errorf("PeekID = %q, want %q", got, c.want)
			}
		})
	}
}

func TestContentRoundTrip(t *testing.T) {
	tests := []struct {
		name     string
		in       string
		isBlocks bool
		out      string
	}{
		{"string", `"hi <b> & co"`, false, `"hi <b> & co"`},
		{"empty string", `""`, false, `""`},
		{"null is the empty string", `null`, false, `""`},
		{"leading space", " \n\t\"x\"", false, `"x"`},
		{"empty array stays an array", `[]`, true, `[]`},
		{"one text block stays a block", `[{"type":"text","text":"hi"}]`, true, `[{"type":"text","text":"hi"}]`},
		{"blocks in order", `[{"type":"reasoning","text":"r"},{"type":"text","text":"t"},{"type":"tool_use","id":"c","name":"n","input":{"b":1,"a":2}}]`,
			true, `[{"type":"reasoning","text":"r"},{"type":"text","text":"t"},{"type":"tool_use","id":"c","name":"n","input":{"b":1,"a":2}}]`},
		{"tool_result string content", `[{"type":"tool_result","tool_use_id":"c","content":"ok","is_error":true}]`,
			true, `[{"type":"tool_result","tool_use_id":"c","content":"ok","is_error":true}]`},
		{"tool_result block content", `[{"type":"tool_result","tool_use_id":"c","content":[{"type":"text","text":"ok"}]}]`,
			true, `[{"type":"tool_result","tool_use_id":"c","content":[{"type":"text","text":"ok"}]}]`},
		{"image", `[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAA="}}]`,
			true, `[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAA="}}]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c schema.Content
			if err := json.Unmarshal([]byte(tt.in), &c); err != nil {
				t.Fatal(err)
			}
			if c.IsBlocks != tt.isBlocks {
				t.Errorf("IsBlocks = %v, want %v", c.IsBlocks, tt.isBlocks)
			}
			if tt.isBlocks && c.Blocks == nil {
				t.Errorf("array content has nil Blocks")
			}
			out, err := schema.Marshal(c)
			if err != nil {
				t.Fatal(err)
			}
			if string(out) != tt.out {
				t.Errorf("encoded %s, want %s", out, tt.out)
			}
		})
	}
	for _, bad := range []string{`42`, `true`, `{"type":"text"}`, `[1]`, `[{"type":5}]`} {
		var c schema.Content
		if err := json.Unmarshal([]byte(bad), &c); err == nil {
			t.Errorf("content %s decoded to %+v", bad, c)
		}
	}
}

func TestContentHelpers(t *testing.T) {
	if got := schema.TextContent("").BlocksOf(); got != nil {
		t.Errorf("empty text BlocksOf = %+v", got)
	}
	if got := schema.TextContent("hi").BlocksOf(); !reflect.DeepEqual(got, []schema.Block{{Type: schema.BlockText, Text: "hi"}}) {
		t.Errorf("text BlocksOf = %+v", got)
	}
	c := schema.BlockContent(schema.Block{Type: schema.BlockToolUse, ID: "c", Name: "n"})
	if !c.HasBlock(schema.BlockToolUse) || c.HasBlock(schema.BlockToolResult) {
		t.Errorf("HasBlock wrong for %+v", c)
	}
	if out, _ := schema.Marshal(schema.BlockContent()); string(out) != "[]" {
		t.Errorf("empty BlockContent encodes as %s", out)
	}
}

// The tool input's bytes are what the token counter sees, so they must come
// back exactly: key order kept, <>& not escaped.
func TestToolUseInputBytesPreserved(t *testing.T) {
	const input = `{"path":"a<b>&c","z":1,"a":[2,{"k":"v"}]}`
	payload := `{"id":"` + testID + `","conversation_id":"task-42","ts":5,"role":"assistant","content":[` +
		`{"type":"tool_use","id":"call_1","name":"write","input":` + input + `}]}`
	in, err := schema.DecodeInput(turnSub, []byte(payload))
	if err != nil {
		t.Fatal(err)
	}
	if got := string(in.Turn.Content.Blocks[0].Input); got != input {
		t.Errorf("decoded input = %s, want %s", got, input)
	}
	out, err := schema.Marshal(in.Turn)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(out, []byte(`"input":`+input+`}`)) {
		t.Errorf("encoded turn lost the input bytes: %s", out)
	}
	if string(out) != payload {
		t.Errorf("turn round trip changed bytes:\n got %s\nwant %s", out, payload)
	}
}

func TestDecodeEventAllTypes(t *testing.T) {
	for _, e := range sampleEvents() {
		h := e.Header()
		t.Run(string(h.Type), func(t *testing.T) {
			data, err := schema.Marshal(e)
			if err != nil {
				t.Fatal(err)
			}
			back, err := schema.DecodeEvent(data)
			if err != nil {
				t.Fatal(err)
			}
			if reflect.TypeOf(back) != reflect.TypeOf(e) {
				t.Fatalf("decoded as %T, want %T", back, e)
			}
			if !reflect.DeepEqual(back, e) {
				t.Errorf("round trip:\n got %+v\nwant %+v", back, e)
			}
			if want := "ctx.events.task-42." + string(h.Type); schema.EventSubject(back) != want {
				t.Errorf("subject %q, want %q", schema.EventSubject(back), want)
			}
		})
	}
	for _, bad := range []string{`{"type":"nope"}`, `{}`, `[]`, `{"type":"rewind","cutoff_ts":"x"}`} {
		if e, err := schema.DecodeEvent([]byte(bad)); err == nil {
			t.Errorf("DecodeEvent(%s) = %+v", bad, e)
		}
	}
}

func TestProfileValidate(t *testing.T) {
	tests := []struct {
		name string
		p    schema.Profile
		ok   bool
	}{
		{"minimal", schema.Profile{ID: "p", ContextWindow: 1000}, true},
		{"full", schema.Profile{ID: "p", ContextWindow: 200000, MaxTokens: 8192, Strategy: schema.StrategyPreserveFraction,
			Counter: schema.CounterChars, FudgeFactor: 1.2}, true},
		{"no id", schema.Profile{ContextWindow: 1000}, false},
		{"id with every allowed character", schema.Profile{ID: "Team-2_eu=x/demo.16k", ContextWindow: 1000}, true},
		{"id at the length cap", schema.Profile{ID: strings.Repeat("p", schema.MaxProfileIDBytes), ContextWindow: 1000}, true},
		// An id of kilobytes would make the service's bucket read close
		// its connection.
		{"id over the length cap", schema.Profile{ID: strings.Repeat("p", schema.MaxProfileIDBytes+1), ContextWindow: 1000}, false},
		{"id with a space", schema.Profile{ID: "demo 16k", ContextWindow: 1000}, false},
		{"id with a wildcard", schema.Profile{ID: "demo.>", ContextWindow: 1000}, false},
		{"id starting with a dot", schema.Profile{ID: ".demo", ContextWindow: 1000}, false},
		{"id ending with a dot", schema.Profile{ID: "demo.", ContextWindow: 1000}, false},
		{"id with two dots in a row", schema.Profile{ID: "demo..16k", ContextWindow: 1000}, false},
		{"id not ASCII", schema.Profile{ID: "démo", ContextWindow: 1000}, false},
		{"no window", schema.Profile{ID: "p"}, false},
		{"max_tokens = window", schema.Profile{ID: "p", ContextWindow: 1000, MaxTokens: 1000}, false},
		{"negative max_tokens", schema.Profile{ID: "p", ContextWindow: 1000, MaxTokens: -1}, false},
		{"unknown strategy", schema.Profile{ID: "p", ContextWindow: 1000, Strategy: "shrink"}, false},
		{"unknown counter", schema.Profile{ID: "p", ContextWindow: 1000, Counter: "words"}, false},
		{"negative fudge", schema.Profile{ID: "p", ContextWindow: 1000, FudgeFactor: -1}, false},
		// 1e18 × a count overflows an int: every message would count MinInt64.
		{"fudge 1e18", schema.Profile{ID: "p", ContextWindow: 1000, FudgeFactor: 1e18}, false},
		{"fudge just over the cap", schema.Profile{ID: "p", ContextWindow: 1000, FudgeFactor: schema.MaxFudgeFactor + 0.001}, false},
		{"fudge at the cap", schema.Profile{ID: "p", ContextWindow: 1000, FudgeFactor: schema.MaxFudgeFactor}, true},
		{"tiny fudge", schema.Profile{ID: "p", ContextWindow: 1000, FudgeFactor: 0.01}, true},
		{"fudge NaN", schema.Profile{ID: "p", ContextWindow: 1000, FudgeFactor: math.NaN()}, false},
		{"fudge +Inf", schema.Profile{ID: "p", ContextWindow: 1000, FudgeFactor: math.Inf(1)}, false},
		{"fudge -Inf", schema.Profile{ID: "p", ContextWindow: 1000, FudgeFactor: math.Inf(-1)}, false},
		{"window at the cap", schema.Profile{ID: "p", ContextWindow: schema.MaxTokenCount, MaxTokens: schema.MaxTokenCount - 1}, true},
		{"window over the cap", schema.Profile{ID: "p", ContextWindow: schema.MaxTokenCount + 1}, false},
		{"window max int", schema.Profile{ID: "p", ContextWindow: math.MaxInt}, false},
		{"negative window", schema.Profile{ID: "p", ContextWindow: -5}, false},
		{"max_tokens over window", schema.Profile{ID: "p", ContextWindow: 1000, MaxTokens: math.MaxInt}, false},
		{"llm timeout at the cap", schema.Profile{ID: "p", ContextWindow: 1000, LLM: schema.LLMConfig{TimeoutSeconds: schema.MaxLLMTimeoutSeconds}}, true},
		{"llm timeout that would wrap a Duration", schema.Profile{ID: "p", ContextWindow: 1000, LLM: schema.LLMConfig{TimeoutSeconds: 1e13}}, false},
		{"condense_llm timeout over the cap", schema.Profile{ID: "p", ContextWindow: 1000, CondenseLLM: schema.LLMConfig{TimeoutSeconds: schema.MaxLLMTimeoutSeconds + 1}}, false},
		{"negative llm timeout", schema.Profile{ID: "p", ContextWindow: 1000, LLM: schema.LLMConfig{TimeoutSeconds: -1}}, false},
		// api_key_env may name only the variables set aside for LLM keys:
		// a profile writer must not get the service's NATS password (or
		// anything else of its environment) sent to a URL of theirs.
		{"llm key in OPENAI_API_KEY", schema.Profile{ID: "p", ContextWindow: 1000, LLM: schema.LLMConfig{APIKeyEnv: "OPENAI_API_KEY"}}, true},
		{"llm key in a CTXPIPE_LLM_KEY_ variable", schema.Profile{ID: "p", ContextWindow: 1000, CondenseLLM: schema.LLMConfig{APIKeyEnv: "CTXPIPE_LLM_KEY_TEAM_2"}}, true},
		{"llm key in NATS_PASSWORD", schema.Profile{ID: "p", ContextWindow: 1000, LLM: schema.LLMConfig{APIKeyEnv: "NATS_PASSWORD"}}, false},
		{"condense_llm key in HOME", schema.Profile{ID: "p", ContextWindow: 1000, CondenseLLM: schema.LLMConfig{APIKeyEnv: "HOME"}}, false},
		{"llm key in the bare prefix", schema.Profile{ID: "p", ContextWindow: 1000, LLM: schema.LLMConfig{APIKeyEnv: "CTXPIPE_LLM_KEY_"}}, false},
		{"llm key in a lower-case name", schema.Profile{ID: "p", ContextWindow: 1000, LLM: schema.LLMConfig{APIKeyEnv: "CTXPIPE_LLM_KEY_team"}}, false},
		{"llm key in a name with '='", schema.Profile{ID: "p", ContextWindow: 1000, LLM: schema.LLMConfig{APIKeyEnv: "CTXPIPE_LLM_KEY_A=B"}}, false},
		{"llm key in an over-long name", schema.Profile{ID: "p", ContextWindow: 1000, LLM: schema.LLMConfig{APIKeyEnv: "CTXPIPE_LLM_KEY_" + strings.Repeat("A", 200)}}, false},
		{"llm key in the service's key setting", schema.Profile{ID: "p", ContextWindow: 1000, LLM: schema.LLMConfig{APIKeyEnv: "CTXPIPE_LLM_API_KEY_ENV"}}, false},
		{"prices at the cap", schema.Profile{ID: "p", ContextWindow: 1000, Prices: schema.Prices{InputPerMTok: schema.MaxPricePerMTok, OutputPerMTok: 0}}, true},
		{"negative price", schema.Profile{ID: "p", ContextWindow: 1000, Prices: schema.Prices{InputPerMTok: -1}}, false},
		{"price NaN", schema.Profile{ID: "p", ContextWindow: 1000, Prices: schema.Prices{OutputPerMTok: math.NaN()}}, false},
		{"price +Inf", schema.Profile{ID: "p", ContextWindow: 1000, Prices: schema.Prices{OutputPerMTok: math.Inf(1)}}, false},
		{"price over the cap", schema.Profile{ID: "p", ContextWindow: 1000, Prices: schema.Prices{InputPerMTok: 1e300}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.p.Validate()
			if (err == nil) != tt.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tt.ok)
			}
			if err != nil && schema.ReasonOf(err) != schema.ReasonBadProfile {
				t.Errorf("reason %q, want bad_profile", schema.ReasonOf(err))
			}
		})
	}
	p := schema.Profile{ID: "p", ContextWindow: 1000}
	if p.ReservedTokens() != schema.DefaultMaxTokens || p.Fudge() != schema.DefaultFudgeFactor ||
		p.StrategyOrDefault() != schema.StrategyKeepTail || !p.AutoCondenseOr(schema.DefaultGlobals()) {
		t.Errorf("defaults of an empty profile: %d %v %s", p.ReservedTokens(), p.Fudge(), p.StrategyOrDefault())
	}
	off := false
	p.AutoCondense = &off
	if p.AutoCondenseOr(schema.DefaultGlobals()) {
		t.Errorf("auto_condense false did not override the global")
	}
	for _, bad := range []string{
		`{"id":"p","context_window":0}`,
		`{"id":"p","context_window":1000,"fudge_factor":1e18}`,
		`{"id":"p","context_window":9223372036854775807}`,
		`{"id":"p","context_window":1000,"llm":{"timeout_seconds":10000000000000}}`,
		`{"id":"p","context_window":1000,"prices":{"input_per_mtok":1e308,"output_per_mtok":0}}`,
	} {
		if _, err := schema.DecodeProfile([]byte(bad)); schema.ReasonOf(err) != schema.ReasonBadProfile {
			t.Errorf("DecodeProfile(%s): %v, want bad_profile", bad, err)
		}
	}
	got, err := schema.DecodeProfile([]byte(`{"id":"claude-sonnet","context_window":200000,"max_tokens":8192,` +
		`"auto_condense":true,"condense_threshold":-1,"strategy":"keep_tail","fudge_factor":1.5,"custom_prompt":"",` +
		`"llm":{"base_url":"","model":"","api_key_env":"OPENAI_API_KEY"},"condense_llm":{"model":"cheap"},` +
		`"prices":{"input_per_mtok":3.0,"output_per_mtok":15.0}}`))
	if err != nil {
		t.Fatalf("DecodeProfile of the DESIGN.md example: %v", err)
	}
	if got.CondenseLLM.Model != "cheap" || got.Prices.Cost(1e6, 1e6) != 18 || *got.CondenseThreshold != -1 {
		t.Errorf("decoded profile: %+v", got)
	}
}

func TestEffectiveThreshold(t *testing.T) {
	ptr := func(v int) *int { return &v }
	tests := []struct {
		name      string
		threshold *int
		want      int
		warns     bool
	}{
		{"absent inherits", nil, 80, false},
		{"-1 inherits", ptr(-1), 80, false},
		{"in range", ptr(60), 60, false},
		{"lower bound", ptr(5), 5, false},
		{"upper bound", ptr(100), 100, false},
		{"below range falls back", ptr(4), 80, true},
		{"zero falls back", ptr(0), 80, true},
		{"above range falls back, no clamping", ptr(101), 80, true},
		{"-2 falls back", ptr(-2), 80, true},
		{"max int falls back", ptr(math.MaxInt), 80, true},
		{"min int falls back", ptr(math.MinInt), 80, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			log := slog.New(slog.NewTextHandler(&logs, nil))
			p := schema.Profile{ID: "p", ContextWindow: 1000, CondenseThreshold: tt.threshold}
			if got := p.EffectiveThreshold(80, log); got != tt.want {
				t.Errorf("EffectiveThreshold = %d, want %d", got, tt.want)
			}
			if warned := strings.Contains(logs.String(), "level=WARN"); warned != tt.warns {
				t.Errorf("warned = %v, want %v (log: %q)", warned, tt.warns, logs.String())
			}
			if got := p.EffectiveThreshold(80, nil); got != tt.want {
				t.Errorf("with a nil logger = %d, want %d", got, tt.want)
			}
			if got, valid := p.Threshold(80); got != tt.want || valid == tt.warns {
				t.Errorf("Threshold = %d, %v; want %d, %v", got, valid, tt.want, !tt.warns)
			}
		})
	}
}

// TestDecodeTranscripts decodes every line of the shared real transcripts:
// all of them are valid turns, and each one's conversation is its file name.
func TestDecodeTranscripts(t *testing.T) {
	var lines, blocks atomic.Int64
	// One parallel subtest per file: 7743 lines take seconds under -race.
	t.Run("files", func(t *testing.T) {
		for _, file := range transcriptFiles(t) {
			conv := strings.TrimSuffix(filepath.Base(file), ".jsonl")
			t.Run(conv, func(t *testing.T) {
				t.Parallel()
				subject := schema.InputSubject(conv, schema.KindTurn)
				f, err := os.Open(file)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				sc := bufio.NewScanner(f)
				sc.Buffer(nil, 16<<20)
				n := 0
				for sc.Scan() {
					n++
					in, err := schema.DecodeInput(subject, sc.Bytes())
					if err != nil {
						t.Errorf("%s:%d: %v", filepath.Base(file), n, err)
						continue
					}
					blocks.Add(int64(len(in.Turn.Content.Blocks)))
				}
				if err := sc.Err(); err != nil {
					t.Errorf("%s: %v", file, err)
				}
				lines.Add(int64(n))
			})
		}
	})
	// The README's figures: 7743 turns; 2797 text, 3850 tool_use, 3850
	// tool_result and 526 reasoning blocks.
	const wantBlocks = 2797 + 3850 + 3850 + 526
	if lines.Load() != 7743 || blocks.Load() != wantBlocks {
		t.Errorf("decoded %d lines and %d blocks, want 7743 and %d", lines.Load(), blocks.Load(), wantBlocks)
	}
}

func TestClip(t *testing.T) {
	for _, c := range []struct {
		in   string
		max  int
		want string
	}{
		{"short", 10, "short"},
		{strings.Repeat("a", 10), 10, strings.Repeat("a", 10)},
		{strings.Repeat("a", 100), 40, strings.Repeat("a", 18) + "… (100 bytes in all)"},
		{strings.Repeat("é", 50), 41, strings.Repeat("é", 9) + "… (100 bytes in all)"},
		{strings.Repeat("a", 100), 5, "… (100 bytes in all)"},
	} {
		got := schema.Clip(c.in, c.max)
		if got != c.want || !utf8.ValidString(got) {
			t.Errorf("Clip(%d bytes, %d) = %q, want %q", len(c.in), c.max, got, c.want)
		}
	}
}
