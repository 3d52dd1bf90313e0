package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/ctxpipe/ctxpipe/schema"
)

// post sends a raw request to the proxy.
func (h *harness) post(t *testing.T, path string, body []byte, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, h.srv.URL+path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func TestRetriedRequestRecordsNothingTwice(t *testing.T) {
	h := newHarness(t, nil)
	body := []byte(`{"model":"m","max_tokens":100,"messages":[{"role":"user","content":"Fix it."},` +
		`{"role":"assistant","content":[{"type":"text","text":"Looking."}]},{"role":"user","content":"Go on."}]}`)
	hdr := map[string]string{"X-Claude-Code-Session-Id": "retry-1"}
	for i := range 3 {
		resp, b := h.post(t, "/v1/messages", body, hdr)
		if resp.StatusCode != 200 {
			t.Fatalf("try %d: %d %s", i, resp.StatusCode, b)
		}
	}
	full := h.full(t, "retry-1")
	if len(full) != 4 {
		t.Fatalf("%d messages recorded, want 3 turns and the first reply", len(full))
	}
	if rej := h.rejected(t, "retry-1"); len(rej) > 0 {
		t.Errorf("rejected: %v", rej)
	}
	// The same turns written another way (a string as one text block, a
	// cache_control breakpoint, key order) are the same turns.
	body2 := []byte(`{"model":"m","max_tokens":100,"messages":[{"content":[{"text":"Fix it.","type":"text","cache_control":{"type":"ephemeral"}}],"role":"user"},` +
		`{"role":"assistant","content":"Looking."},{"role":"user","content":[{"type":"text","text":"Go on."}]}]}`)
	resp, b := h.post(t, "/v1/messages", body2, hdr)
	if resp.StatusCode != 200 || resp.Header.Get("X-Ctxpipe-Conversation") != "retry-1" {
		t.Fatalf("%d %s, conversation %q", resp.StatusCode, b, resp.Header.Get("X-Ctxpipe-Conversation"))
	}
	if n := len(h.full(t, "retry-1")); n != 4 {
		t.Errorf("%d messages after the rewritten request, want 4", n)
	}
}

func TestSubAgentsStayApart(t *testing.T) {
	h := newHarness(t, nil)
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for a := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			agent := fmt.Sprintf("agent%d", a)
			c := h.anthClient(option.WithHeader("X-Claude-Code-Session-Id", "sess-1"), option.WithHeader("X-Claude-Code-Agent-Id", agent),
				option.WithHeader("X-Claude-Code-Parent-Agent-Id", "main"))
			msgs := []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("You are " + agent + ": search the code."))}
			for i := range 6 {
				var resp *http.Response
				m, err := c.Messages.New(context.Background(), anthropic.MessageNewParams{Model: "m", MaxTokens: 100, Messages: msgs, Tools: anthTools},
					option.WithResponseInto(&resp))
				if err != nil {
					errs <- err
					return
				}
				if got, want := resp.Header.Get("X-Ctxpipe-Conversation"), "sess-1__"+agent; got != want {
					errs <- fmt.Errorf("conversation %q, want %q", got, want)
					return
				}
				if got := resp.Header.Get("X-Ctxpipe-Parent-Conversation"); got != "sess-1__main" {
					errs <- fmt.Errorf("parent %q", got)
					return
				}
				msgs = append(msgs, m.ToParam(), anthNext(*m, i))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for a := range 3 {
		conv := fmt.Sprintf("sess-1__agent%d", a)
		full := h.waitFull(t, conv, 12)
		if len(full) != 12 {
			t.Errorf("%s: %d messages, want 12", conv, len(full))
		}
		for _, m := range full {
			if b, _ := json.Marshal(m.Content); strings.Contains(string(b), "You are agent") && !strings.Contains(string(b), fmt.Sprintf("agent%d", a)) {
				t.Errorf("%s holds another agent's message: %s", conv, b)
			}
		}
	}
}

func TestOverflowReducesAndRetriesOnce(t *testing.T) {
	h := newHarness(t, nil)
	c := h.anthClient(option.WithHeader("X-Claude-Code-Session-Id", "over-1"))
	msgs := []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Fix the failing test."))}
	var reply anthropic.Message
	for i := range 6 {
		if i > 0 {
			msgs = append(msgs, anthNext(reply, i))
		}
		reply, _ = anthStep(t, c, msgs, false)
		msgs = append(msgs, reply.ToParam())
	}
	before := len(h.model.requests())
	// The provider's window is now smaller than the history.
	h.model.mu.Lock()
	h.model.overflowOver = len(strings.Join(h.model.reqs[before-1].list(t), "")) - 200
	h.model.mu.Unlock()
	msgs = append(msgs, anthNext(reply, 6))
	reply, hdr := anthStep(t, c, msgs, true)
	if len(reply.Content) == 0 {
		t.Fatal("no reply after the overflow")
	}
	reqs := h.model.requests()[before:]
	if len(reqs) != 2 {
		t.Fatalf("the upstream got %d requests for one call, want the refused one and one retry", len(reqs))
	}
	if a, b := len(reqs[0].list(t)), len(reqs[1].list(t)); b >= a {
		t.Errorf("the retry held %d messages, the refused request %d: nothing was reduced", b, a)
	}
	st, err := h.c.Status(context.Background(), "over-1")
	if err != nil {
		t.Fatal(err)
	}
	if st.Condensations+st.Truncations == 0 {
		t.Errorf("no reduction recorded")
	}
	_ = hdr
}

func TestClientRewroteHistory(t *testing.T) {
	h := newHarness(t, nil)
	hdr := map[string]string{"X-Claude-Code-Session-Id": "rw-1"}
	first := `{"model":"m","max_tokens":100,"messages":[{"role":"user","content":"Fix it."},{"role":"assistant","content":"Looking."},{"role":"user","content":"Go on."}]}`
	if resp, b := h.post(t, "/v1/messages", []byte(first), hdr); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	// The client edited its second message.
	edited := `{"model":"m","max_tokens":100,"messages":[{"role":"user","content":"Fix it."},{"role":"assistant","content":"Looking closer."},{"role":"user","content":"Go on."}]}`
	resp, b := h.post(t, "/v1/messages", []byte(edited), hdr)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if got := resp.Header.Get("X-Ctxpipe-Conversation"); got != "rw-1-f1" {
		t.Errorf("continued in %q, want rw-1-f1", got)
	}
	if got := resp.Header.Get("X-Ctxpipe-Forked-From"); got != "rw-1" {
		t.Errorf("forked from %q, want rw-1", got)
	}
	if n := len(h.full(t, "rw-1")); n != 4 {
		t.Errorf("the old conversation has %d messages, want its 4 untouched", n)
	}
	if n := len(h.waitFull(t, "rw-1-f1", 4)); n != 4 {
		t.Errorf("the new conversation has %d messages, want the edited 3 and the reply", n)
	}
	// The new conversation records the one it continues, with an event.
	if got := h.forks(t, "rw-1-f1"); len(got) != 1 || got[0] != "rw-1" {
		t.Errorf("rw-1-f1 says it continues %v, want [rw-1]", got)
	}
	if full := h.full(t, "rw-1-f1"); full[0].ContinuesFrom != "rw-1" {
		t.Errorf("its first turn continues from %q", full[0].ContinuesFrom)
	}
	// The upstream got the client's history as it is now.
	reqs := h.model.requests()
	if got := reqs[len(reqs)-1].list(t); len(got) != 3 || !strings.Contains(got[1], "Looking closer.") {
		t.Errorf("upstream got %v", got)
	}
	// The edited line goes on in the new conversation.
	var reply struct {
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(b, &reply); err != nil {
		t.Fatal(err)
	}
	next := `{"model":"m","max_tokens":100,"messages":[{"role":"user","content":"Fix it."},{"role":"assistant","content":"Looking closer."},{"role":"user","content":"Go on."},` +
		`{"role":"assistant","content":` + string(reply.Content) + `},{"role":"user","content":"Thanks."}]}`
	resp, _ = h.post(t, "/v1/messages", []byte(next), hdr)
	if got := resp.Header.Get("X-Ctxpipe-Conversation"); got != "rw-1-f1" || resp.Header.Get("X-Ctxpipe-Forked-From") != "" {
		t.Errorf("the next request went to %q (forked from %q)", got, resp.Header.Get("X-Ctxpipe-Forked-From"))
	}
}

func TestBadInputs(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxBodyBytes = 4096 })
	for _, tc := range []struct {
		name, path, body string
		hdr              map[string]string
	}{
		{"malformed JSON", "/v1/messages", `{"model":"m","messages":[`, nil},
		{"not an object", "/v1/chat/completions", `[1,2]`, nil},
		{"invalid UTF-8", "/v1/messages", "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}", nil},
		{"unknown role", "/v1/messages", `{"model":"m","messages":[{"role":"robot","content":"beep"}]}`, nil},
		{"unknown role", "/v1/chat/completions", `{"model":"m","messages":[{"role":"robot","content":"beep"}]}`, nil},
		{"unknown role", "/v1/responses", `{"model":"m","input":[{"role":"robot","content":"beep"}]}`, nil},
		{"oversized", "/v1/messages", `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 5000) + `"}]}`, nil},
		{"bad session id", "/v1/messages", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, map[string]string{"X-Claude-Code-Session-Id": "a.b>c"}},
	} {
		t.Run(tc.name+" "+tc.path, func(t *testing.T) {
			before := len(h.model.requests())
			resp, b := h.post(t, tc.path, []byte(tc.body), tc.hdr)
			if resp.StatusCode != 400 {
				t.Fatalf("status %d, want 400: %s", resp.StatusCode, b)
			}
			var e struct {
				Type  string `json:"type"`
				Error struct {
					Type    string `json:"type"`
					Message string `json:"message"`
				} `json:"error"`
			}
			if err := json.Unmarshal(b, &e); err != nil || e.Error.Message == "" || e.Error.Type != "invalid_request_error" {
				t.Fatalf("error body %s", b)
			}
			if (tc.path == "/v1/messages") != (e.Type == "error") {
				t.Errorf("error body not in the API's format: %s", b)
			}
			if len(h.model.requests()) != before {
				t.Errorf("a bad request reached the upstream")
			}
		})
	}
	// The SDK reads the error as an API error of its own.
	c := h.anthClient()
	_, err := c.Messages.New(context.Background(), anthropic.MessageNewParams{Model: "m", MaxTokens: 10,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(strings.Repeat("x", 5000)))}})
	var ae *anthropic.Error
	if !errors.As(err, &ae) || ae.StatusCode != 400 {
		t.Errorf("the SDK got %v", err)
	}
}

func TestUpstreamFailures(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.HeaderTimeout = 300 * time.Millisecond })
	body := []byte(`{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`)
	h.model.mu.Lock()
	h.model.hang = 5 * time.Second
	h.model.mu.Unlock()
	resp, b := h.post(t, "/v1/messages", body, map[string]string{"X-Claude-Code-Session-Id": "hang-1"})
	if resp.StatusCode != http.StatusGatewayTimeout || !strings.Contains(string(b), `"type":"error"`) {
		t.Errorf("a hanging upstream: %d %s", resp.StatusCode, b)
	}
	h.model.mu.Lock()
	h.model.hang = 0 // the handler of the request that timed out may still be reading it
	h.model.mu.Unlock()
	h.proxy.cfg.OpenAI.BaseURL = "http://127.0.0.1:1/v1"
	resp, b = h.post(t, "/v1/chat/completions", []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`), nil)
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(b), `"error":{`) {
		t.Errorf("an unreachable upstream: %d %s", resp.StatusCode, b)
	}
	// The turn of the failed request is recorded whole, and a retry adds nothing.
	if n := len(h.full(t, "hang-1")); n != 1 {
		t.Errorf("%d messages after the failed request, want its one turn", n)
	}
}

func TestWebSocketRefusedAndModelsPassed(t *testing.T) {
	h := newHarness(t, nil)
	req, _ := http.NewRequest(http.MethodGet, h.srv.URL+"/v1/responses", nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	req.Header.Set("Sec-WebSocket-Version", "13")
	resp, _ := send(t, req)
	if resp.StatusCode != http.StatusUpgradeRequired {
		t.Errorf("a WebSocket upgrade got %d, want 426", resp.StatusCode)
	}
	resp, err := http.Get(h.srv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), "test-model") {
		t.Errorf("GET /v1/models: %d %s", resp.StatusCode, b)
	}
}

// forks returns the conversations conv's conversation_forked events say it
// continues.
func (h *harness) forks(t *testing.T, conv string) []string {
	t.Helper()
	return storedOf(t, h, conv, func(f *schema.ConversationForked) string { return f.ContinuesFrom })
}

// An agent compacts its history itself (Claude Code's summary prompt): the
// compaction request goes upstream untouched and is recorded in the
// conversation; the history the agent goes on with starts from the
// summary, so it is a new conversation, which records that it continues
// the compacted one.
func TestAgentCompactionContinuesInALinkedConversation(t *testing.T) {
	h := newHarness(t, nil)
	hdr := map[string]string{"X-Claude-Code-Session-Id": "cmp-1"}
	first := `{"role":"user","content":"Fix the failing test in pkg/x."},{"role":"assistant","content":"Looking."},{"role":"user","content":"Go on."}`
	resp, b := h.post(t, "/v1/messages", []byte(`{"model":"m","max_tokens":100,"messages":[`+first+`]}`), hdr)
	var reply struct {
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(b, &reply); resp.StatusCode != 200 || err != nil {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	prompt := `{"model":"m","max_tokens":100,"messages":[` + first + `,{"role":"assistant","content":` + string(reply.Content) +
		`},{"role":"user","content":"Your task is to create a detailed summary of the conversation so far."}]}`
	resp, b = h.post(t, "/v1/messages", []byte(prompt), hdr)
	if resp.StatusCode != 200 || resp.Header.Get("X-Ctxpipe-Conversation") != "cmp-1" {
		t.Fatalf("the compaction request: %d %s in %q", resp.StatusCode, b, resp.Header.Get("X-Ctxpipe-Conversation"))
	}
	reqs := h.model.requests()
	if got := reqs[len(reqs)-1].body; !bytes.Equal(got, []byte(prompt)) {
		t.Errorf("the compaction request did not go upstream untouched:\n%s", got)
	}
	if n := h.agentTurns(t, "cmp-1", 6); n != 6 {
		t.Fatalf("%d agent turns in cmp-1, want the compaction request's 5 and its reply", n)
	}
	// The agent goes on from the summary, without its analysis and tags.
	summary := strings.TrimSpace(compactionSummary[strings.Index(compactionSummary, "<summary>")+len("<summary>") : strings.Index(compactionSummary, "</summary>")])
	next := `{"model":"m","max_tokens":100,"messages":[{"role":"user","content":` + js("This session continues an earlier one. Summary:\n"+summary) + `}]}`
	resp, b = h.post(t, "/v1/messages", []byte(next), hdr)
	conv := resp.Header.Get("X-Ctxpipe-Conversation")
	if resp.StatusCode != 200 || !strings.HasPrefix(conv, "cmp-1__t") {
		t.Fatalf("the compacted history: %d %s in %q, want a thread of cmp-1", resp.StatusCode, b, conv)
	}
	if got := resp.Header.Get("X-Ctxpipe-Forked-From"); got != "cmp-1" {
		t.Errorf("X-Ctxpipe-Forked-From %q, want cmp-1", got)
	}
	if got := h.forks(t, conv); len(got) != 1 || got[0] != "cmp-1" {
		t.Errorf("%s says it continues %v, want [cmp-1]", conv, got)
	}
	// A side request of the same session that quotes nothing of the
	// summary is a thread of its own, linked to nothing.
	side := `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"Write a 5-word title for this session."}]}`
	resp, _ = h.post(t, "/v1/messages", []byte(side), hdr)
	if other := resp.Header.Get("X-Ctxpipe-Conversation"); other == conv || resp.Header.Get("X-Ctxpipe-Forked-From") != "" || len(h.forks(t, other)) != 0 {
		t.Errorf("the side request went to %q, linked to %q", other, resp.Header.Get("X-Ctxpipe-Forked-From"))
	}
}
