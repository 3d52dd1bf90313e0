package proxy

import (
	"net/http"
	"strings"
	"testing"

	"github.com/ctxpipe/ctxpipe/schema"
)

func TestMatchTurns(t *testing.T) {
	for _, tc := range []struct {
		rec, req []string
		v        verdict
		at       int
	}{
		{nil, []string{"a"}, extends, 0},
		{[]string{"a"}, []string{"a", "b"}, extends, 1},
		{[]string{"a", "b"}, []string{"a", "b"}, extends, 2},
		{[]string{"a", "b", "c"}, []string{"a", "b"}, retried, 2},
		{[]string{"a", "b"}, []string{"a", "x", "c"}, diverged, 1},
		{[]string{"a"}, []string{"x"}, diverged, 0},
	} {
		v, at := matchTurns(tc.rec, tc.req)
		if v != tc.v || at != tc.at {
			t.Errorf("match(%v, %v) = %v %d, want %v %d", tc.rec, tc.req, v, at, tc.v, tc.at)
		}
	}
}

func TestRequestKey(t *testing.T) {
	long := strings.Repeat("s", 100)
	for _, tc := range []struct {
		name   string
		hdr    map[string]string
		f      keyFields
		conv   string
		parent string
		bad    bool
	}{
		{"explicit wins", map[string]string{"X-Ctxpipe-Conversation": "c1", "X-Claude-Code-Session-Id": "s1"}, keyFields{}, "c1", "", false},
		{"claude code", map[string]string{"X-Claude-Code-Session-Id": "s1"}, keyFields{}, "s1", "", false},
		{"claude code sub-agent", map[string]string{"X-Claude-Code-Session-Id": "s1", "X-Claude-Code-Agent-Id": "a1", "X-Claude-Code-Parent-Agent-Id": "a0"}, keyFields{}, "s1__a1", "s1__a0", false},
		{"codex", map[string]string{"session_id": "s2"}, keyFields{PromptCacheKey: "k"}, "s2", "", false},
		{"opencode", map[string]string{"X-Session-Id": "s3", "X-Parent-Session-Id": "s0"}, keyFields{}, "s3", "s0", false},
		{"metadata json", nil, keyFields{MetadataUserID: `{"device_id":"d","session_id":"s4"}`}, "s4", "", false},
		{"metadata legacy", nil, keyFields{MetadataUserID: "user_ab_account_cd_session_s5"}, "s5", "", false},
		{"prompt cache key", nil, keyFields{PromptCacheKey: "s6"}, "s6", "", false},
		{"long sub-agent", map[string]string{"X-Claude-Code-Session-Id": long, "X-Claude-Code-Agent-Id": long}, keyFields{}, "", "", false},
		{"bad id", map[string]string{"X-Claude-Code-Session-Id": "a.b"}, keyFields{}, "", "", true},
		{"reserved id", map[string]string{"X-Ctxpipe-Conversation": "_x"}, keyFields{}, "", "", true},
		{"bad metadata session", nil, keyFields{MetadataUserID: `{"session_id":"a b"}`}, "", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tc.hdr {
				h.Set(k, v)
			}
			k, err := requestKey(h, tc.f)
			if tc.bad {
				if err == nil {
					t.Fatalf("want an error, got %+v", k)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			conv := k.Conversation()
			if !schema.ValidConversationID(conv) {
				t.Fatalf("conversation %q is not a valid id", conv)
			}
			if tc.conv != "" && conv != tc.conv {
				t.Errorf("conversation %q, want %q", conv, tc.conv)
			}
			if k.Parent != tc.parent {
				t.Errorf("parent %q, want %q", k.Parent, tc.parent)
			}
		})
	}
	// Without a session: the same system and first message, the same key.
	a, _ := requestKey(http.Header{}, keyFields{Fallback: []byte("sys\x00hello")})
	b, _ := requestKey(http.Header{}, keyFields{Fallback: []byte("sys\x00hello")})
	c, _ := requestKey(http.Header{}, keyFields{Fallback: []byte("sys\x00other")})
	if a != b || a == c || a.Source != "derived" {
		t.Errorf("derived keys %v %v %v", a, b, c)
	}
}

func TestCanonicalForm(t *testing.T) {
	parse := func(body string) *request {
		t.Helper()
		o, err := parseObject([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		r, err := messagesAPI{}.parse(o)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	same := []string{
		`{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"bash","input":{"a":1}}]}]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]},{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"bash","input":{ "a" : 1 },"caller":null}]}]}`,
	}
	a, b := parse(same[0]), parse(same[1])
	for i := range a.turns {
		if string(a.turns[i].canon) != string(b.turns[i].canon) {
			t.Errorf("turn %d: %s vs %s", i, a.turns[i].canon, b.turns[i].canon)
		}
	}
	// A thinking block's signature is part of what the model reads.
	x := parse(`{"messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":"s1"}]}]}`)
	y := parse(`{"messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":"s2"}]}]}`)
	if string(x.turns[0].canon) == string(y.turns[0].canon) {
		t.Error("two signatures, one canonical form")
	}
	// Ids depend on the conversation and the position.
	c := a.turns[0].canon
	if turnID(nil, "c", 0, c) == turnID(nil, "d", 0, c) || turnID(nil, "c", 0, c) == turnID(nil, "c", 1, c) {
		t.Error("ids do not depend on conversation and position")
	}
}

func TestSplice(t *testing.T) {
	o, err := parseObject([]byte(`{"model":"m", "messages" : [1,2], "tools":[{"x":"<&>"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	got := string(o.with("messages", []byte(`[3]`)))
	if want := `{"model":"m", "messages" : [3], "tools":[{"x":"<&>"}]}`; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}
