package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ctxpipe/ctxpipe/schema"
)

// transcripts is the shared real data, relative to this package's directory.
const transcripts = "../../../shared/data/transcripts"

const openAIChat = `[
 {"role":"system","content":"You are a coding agent."},
 {"role":"user","content":"Fix the failing test."},
 {"role":"assistant","content":null,"reasoning_content":"Look at the test first.",
  "tool_calls":[
   {"id":"call_1","type":"function","function":{"name":"bash","arguments":"{\"command\": \"go test ./...\",  \"timeout\":5}"}},
   {"id":"call_2","type":"function","function":{"name":"read","arguments":"{\"path\":\"a<b>&c.go\"}"}}]},
 {"role":"tool","tool_call_id":"call_1","content":"FAIL x_test.go:12"},
 {"role":"tool","tool_call_id":"call_2","content":[{"type":"text","text":"package a"}]},
 {"role":"user","content":"Hurry, please."},
 {"role":"assistant","content":"Fixed."}
]`

const anthropicChat = `{"system":[{"type":"text","text":"Be brief."}],"messages":[
 {"role":"user","content":"hi"},
 {"role":"assistant","content":[{"type":"thinking","thinking":"easy","signature":"sig"},{"type":"redacted_thinking","data":"x"},
   {"type":"text","text":"Let me look."},{"type":"tool_use","id":"toolu_1","name":"ls","input":{"dir": "."}}]},
 {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"a.go","is_error":true}]},
 {"role":"user","content":"and?"}
]}`

func TestDetectFormat(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want Format
		err  bool
	}{
		{"turn lines", `{"id":"x","role":"user","content":"a"}` + "\n" + `{"id":"y","role":"assistant","content":"b"}`, FormatTurns, false},
		{"one turn line", `{"id":"x","role":"user","content":"a"}`, FormatTurns, false},
		{"openai array", openAIChat, FormatOpenAI, false},
		{"openai without system", `[{"role":"user","content":"a"},{"role":"assistant","tool_calls":[{"id":"c","function":{"name":"f","arguments":"{}"}}]}]`, FormatOpenAI, false},
		{"openai wrapper", `{"model":"gpt","messages":[{"role":"developer","content":"x"},{"role":"user","content":"a"}]}`, FormatOpenAI, false},
		{"anthropic wrapper with system", anthropicChat, FormatAnthropic, false},
		{"anthropic array", `[{"role":"user","content":[{"type":"text","text":"a"}]}]`, FormatAnthropic, false},
		{"plain chat array", `[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]`, FormatAnthropic, false},
		{"empty", "  \n", "", true},
		{"not json", "hello", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DetectFormat([]byte(tt.in))
			if (err != nil) != tt.err || got != tt.want {
				t.Fatalf("DetectFormat = %q, %v; want %q (error %v)", got, err, tt.want, tt.err)
			}
		})
	}
}

func TestParseOpenAI(t *testing.T) {
	tr, err := ParseTranscript([]byte(openAIChat), FormatAuto)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Format != FormatOpenAI || tr.SystemPrompt != "You are a coding agent." {
		t.Fatalf("format %q system %q", tr.Format, tr.SystemPrompt)
	}
	roles := []schema.Role{schema.RoleUser, schema.RoleAssistant, schema.RoleUser, schema.RoleAssistant}
	if len(tr.Turns) != len(roles) {
		t.Fatalf("%d turns, want %d (tool messages and the user remark merged)", len(tr.Turns), len(roles))
	}
	for i, r := range roles {
		if tr.Turns[i].Role != r {
			t.Errorf("turn %d role %q, want %q", i, tr.Turns[i].Role, r)
		}
	}
	a := tr.Turns[1].Content.Blocks
	if len(a) != 3 || a[0].Type != schema.BlockReasoning || a[1].Type != schema.BlockToolUse || a[2].Type != schema.BlockToolUse {
		t.Fatalf("assistant blocks %+v", a)
	}
	// The arguments string's bytes, exactly: spacing, key order and <>& kept.
	if got, want := string(a[1].Input), `{"command": "go test ./...",  "timeout":5}`; got != want {
		t.Errorf("tool input %s, want %s", got, want)
	}
	if got, want := string(a[2].Input), `{"path":"a<b>&c.go"}`; got != want {
		t.Errorf("tool input %s, want %s", got, want)
	}
	if a[1].ID != "call_1" || a[1].Name != "bash" {
		t.Errorf("tool_use id %q name %q", a[1].ID, a[1].Name)
	}
	u := tr.Turns[2].Content.Blocks
	if len(u) != 3 || u[0].Type != schema.BlockToolResult || u[0].ToolUseID != "call_1" ||
		u[1].ToolUseID != "call_2" || u[2].Type != schema.BlockText || u[2].Text != "Hurry, please." {
		t.Fatalf("merged user turn %+v", u)
	}
	if u[0].Content.Text != "FAIL x_test.go:12" || !u[1].Content.IsBlocks || u[1].Content.Blocks[0].Text != "package a" {
		t.Errorf("tool result contents %+v / %+v", u[0].Content, u[1].Content)
	}
	if tr.Turns[3].Content.IsBlocks || tr.Turns[3].Content.Text != "Fixed." {
		t.Errorf("text-only assistant turn %+v, want string content", tr.Turns[3].Content)
	}
}

func TestParseAnthropic(t *testing.T) {
	tr, err := ParseTranscript([]byte(anthropicChat), FormatAuto)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Format != FormatAnthropic || tr.SystemPrompt != "Be brief." || len(tr.Turns) != 3 {
		t.Fatalf("format %q system %q turns %d", tr.Format, tr.SystemPrompt, len(tr.Turns))
	}
	a := tr.Turns[1].Content.Blocks
	if len(a) != 3 || a[0].Type != schema.BlockReasoning || a[0].Text != "easy" || a[2].Type != schema.BlockToolUse {
		t.Fatalf("assistant blocks %+v (thinking → reasoning, redacted dropped)", a)
	}
	if string(a[2].Input) != `{"dir": "."}` {
		t.Errorf("tool input %s", a[2].Input)
	}
	u := tr.Turns[2].Content.Blocks
	if len(u) != 2 || !u[0].IsError || u[1].Text != "and?" {
		t.Fatalf("merged user turn %+v", u)
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name, in string
		f        Format
		want     string
	}{
		{"tool without id", `[{"role":"tool","content":"x"}]`, FormatOpenAI, "tool_call_id"},
		{"unknown role", `[{"role":"robot","content":"x"}]`, FormatAnthropic, "role"},
		{"bad turn line", "{\"id\":1}\n", FormatTurns, "turn 1"},
		{"no turns", `[{"role":"system","content":"only a prompt"}]`, FormatOpenAI, "no turns"},
	}
	for _, tt := range tests {
		if _, err := ParseTranscript([]byte(tt.in), tt.f); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err = %v, want it to mention %q", tt.name, err, tt.want)
		}
	}
}

func TestToolInputNotJSON(t *testing.T) {
	if got := string(toolInput(`{"command": "ls`)); got != `{"arguments":"{\"command\": \"ls"}` {
		t.Errorf("malformed arguments kept as %s", got)
	}
	if got := string(toolInput("")); got != "{}" {
		t.Errorf("empty arguments → %s", got)
	}
}

func TestPrepare(t *testing.T) {
	const keep = "0b6c7a9e-1d2f-4c3b-9a8e-7f6d5c4b3a21"
	tr := Transcript{SystemPrompt: "sys", Turns: []schema.Turn{
		{ID: keep, ConversationID: "c1", TS: 100, Role: schema.RoleUser, Content: schema.TextContent("a")},
		{ID: keep, ConversationID: "c1", TS: 100, Role: schema.RoleAssistant, Content: schema.TextContent("b")}, // repeated id and ts
		{ID: "not-a-uuid", ConversationID: "c1", TS: 50, Role: schema.RoleUser, Content: schema.TextContent("c")},
		{Role: schema.RoleAssistant, Content: schema.TextContent("d")},
	}}
	tests := []struct {
		name     string
		conv     string
		keepID   bool
		profile  string
		wantProf string
	}{
		{"same conversation keeps valid ids", "c1", true, "", ""},
		{"other conversation gets derived ids", "c2", false, "p", "p"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Prepare(tr, PrepareOptions{Conv: tt.conv, Profile: tt.profile, Now: 1_000_000})
			if err != nil {
				t.Fatal(err)
			}
			if (got[0].ID == keep) != tt.keepID {
				t.Errorf("first id %s, keep=%v", got[0].ID, tt.keepID)
			}
			ids := map[string]bool{}
			var prev int64
			for i, g := range got {
				if ids[g.ID] {
					t.Errorf("turn %d: id %s repeated", i, g.ID)
				}
				ids[g.ID] = true
				if g.TS <= prev {
					t.Errorf("turn %d: ts %d not after %d", i, g.TS, prev)
				}
				prev = g.TS
				if g.ConversationID != tt.conv || g.SystemPrompt != "sys" || g.ProfileID != tt.wantProf {
					t.Errorf("turn %d: conv %q system %q profile %q", i, g.ConversationID, g.SystemPrompt, g.ProfileID)
				}
			}
		})
	}
	// Publishing the file again, later, to the same other conversation
	// sends the same ids (the service keeps one copy: publishing the
	// README's sample into --conv demo twice stores it once); to a third
	// one, other ids.
	a, errA := Prepare(tr, PrepareOptions{Conv: "c2", Now: 1_000_000})
	b, errB := Prepare(tr, PrepareOptions{Conv: "c2", Now: 2_000_000})
	c, errC := Prepare(tr, PrepareOptions{Conv: "c3", Now: 1_000_000})
	if errA != nil || errB != nil || errC != nil {
		t.Fatal(errA, errB, errC)
	}
	for i := range a {
		if a[i].ID != b[i].ID || a[i].ID == c[i].ID {
			t.Errorf("turn %d: ids %s, then %s; %s in another conversation", i, a[i].ID, b[i].ID, c[i].ID)
		}
	}
	// Another tenant's user publishing the same file to a conversation of
	// the same name derives other ids: input ids are global.
	d, err := Prepare(tr, PrepareOptions{Conv: "c2", Now: 1_000_000, Publisher: "globex-agent"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range a {
		if a[i].ID == d[i].ID {
			t.Errorf("turn %d: the same id %s for two publishers", i, a[i].ID)
		}
	}
	if _, err := Prepare(tr, PrepareOptions{Conv: "a.b"}); err == nil {
		t.Error("subject-unsafe conversation accepted")
	}
	bad := Transcript{Turns: []schema.Turn{{Role: "system", Content: schema.TextContent("x")}}}
	if _, err := Prepare(bad, PrepareOptions{Conv: "c", Now: 1000}); err == nil || !strings.Contains(err.Error(), "turn 1") {
		t.Errorf("invalid turn: err = %v", err)
	}
}

// Every shared transcript parses as turns, keeps its ids in its own
// conversation and validates.
func TestRealTranscripts(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(transcripts, "*.jsonl"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no transcripts under %s: %v", transcripts, err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		tr, err := ParseTranscript(data, FormatAuto)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if tr.Format != FormatTurns {
			t.Fatalf("%s detected as %s", f, tr.Format)
		}
		conv := strings.TrimSuffix(filepath.Base(f), ".jsonl")
		got, err := Prepare(tr, PrepareOptions{Conv: conv, Now: 1})
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for i := range got {
			if got[i].ID != tr.Turns[i].ID || got[i].TS != tr.Turns[i].TS {
				t.Fatalf("%s turn %d: id/ts changed (%s %d → %s %d)", f, i, tr.Turns[i].ID, tr.Turns[i].TS, got[i].ID, got[i].TS)
			}
		}
	}
}

// The sample session shipped in examples/ is a valid transcript: every turn
// validates, roles alternate, every tool_use is answered in the next turn,
// and it is large enough to cross a 16k-window profile's threshold a few
// times (60–90 KB).
func TestSampleSession(t *testing.T) {
	const path = "../../examples/sample-session.jsonl"
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(data); n < 60_000 || n > 90_000 {
		t.Errorf("sample is %d bytes, want 60–90 KB", n)
	}
	tr, err := ParseTranscript(data, FormatAuto)
	if err != nil {
		t.Fatal(err)
	}
	turns, err := Prepare(tr, PrepareOptions{Conv: "sample-session", Now: 1})
	if err != nil {
		t.Fatal(err)
	}
	pending := map[string]bool{}
	for i, tu := range turns {
		if tu.ID != tr.Turns[i].ID {
			t.Fatalf("turn %d: id not kept in its own conversation", i)
		}
		if (i%2 == 0) != (tu.Role == schema.RoleUser) {
			t.Fatalf("turn %d: role %s breaks alternation", i, tu.Role)
		}
		for _, b := range tu.Content.Blocks {
			switch b.Type {
			case schema.BlockToolResult:
				if !pending[b.ToolUseID] {
					t.Fatalf("turn %d: result for %s, which the previous turn did not call", i, b.ToolUseID)
				}
				delete(pending, b.ToolUseID)
			case schema.BlockToolUse:
				pending[b.ID] = true
			}
		}
		if tu.Role == schema.RoleUser && len(pending) > 0 {
			t.Fatalf("turn %d: calls %v left unanswered", i, pending)
		}
	}
	if turns[0].SystemPrompt == "" {
		t.Error("the first turn carries no system prompt")
	}
}

// A turns file's errors name the line to fix, blank lines and all: a bad
// line 6 that holds turn 3 is "line 6 (turn 3)".
func TestTurnsErrorsNameTheLine(t *testing.T) {
	for _, tc := range []struct{ name, data, want string }{
		{"broken JSON", "{\"role\":\"user\",\"content\":\"a\"}\n\n\n{\"role\":\"assistant\",\"content\":\"b\"}\n\n{\"role\":\"user\",\"content\":\"c\"\n", "line 6 (turn 3)"},
		{"garbage after a turn", "{\"role\":\"user\",\"content\":\"a\"}\n{\"role\":\"user\",\"content\":\"c\"} garbage\n", "line 2 (turn 3)"},
		{"invalid turn", "{\"role\":\"user\",\"content\":\"a\"}\n\n{\"role\":\"system\",\"content\":\"b\"}\n", "line 3 (turn 2)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := ParseTranscript([]byte(tc.data), FormatTurns)
			if err == nil {
				_, err = Prepare(tr, PrepareOptions{Conv: "c", Now: 1000})
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
}
