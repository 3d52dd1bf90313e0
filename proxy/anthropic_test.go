package proxy

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/ctxpipe/ctxpipe/schema"
)

// anthClient is the official SDK pointed at the proxy, as an agent is.
func (h *harness) anthClient(opts ...option.RequestOption) anthropic.Client {
	return anthropic.NewClient(append([]option.RequestOption{option.WithBaseURL(h.srv.URL), option.WithAPIKey("client-key"),
		option.WithMaxRetries(0)}, opts...)...)
}

var anthTools = []anthropic.ToolUnionParam{
	{OfTool: &anthropic.ToolParam{Name: "bash", InputSchema: anthropic.ToolInputSchemaParam{Properties: map[string]any{"command": map[string]any{"type": "string"}}}}},
	{OfTool: &anthropic.ToolParam{Name: "read_file", InputSchema: anthropic.ToolInputSchemaParam{Properties: map[string]any{"path": map[string]any{"type": "string"}}}}},
}

// anthStep sends msgs and returns the assistant's reply as the SDK gives
// it back to an agent, and the response's headers.
func anthStep(t *testing.T, c anthropic.Client, msgs []anthropic.MessageParam, stream bool, opts ...option.RequestOption) (anthropic.Message, http.Header) {
	t.Helper()
	var resp *http.Response
	opts = append(opts, option.WithResponseInto(&resp))
	params := anthropic.MessageNewParams{Model: "test-model", MaxTokens: 400, Messages: msgs, Tools: anthTools,
		System: []anthropic.TextBlockParam{{Text: "You are a careful coding agent."}}}
	ctx := context.Background()
	if !stream {
		m, err := c.Messages.New(ctx, params, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return *m, resp.Header
	}
	s := c.Messages.NewStreaming(ctx, params, opts...)
	var acc anthropic.Message
	for s.Next() {
		if err := acc.Accumulate(s.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	return acc, resp.Header
}

// anthNext is the agent's next message: the results of the reply's tool
// calls (a long listing, so the context grows), or a new instruction.
func anthNext(reply anthropic.Message, i int) anthropic.MessageParam {
	var results []anthropic.ContentBlockParamUnion
	for _, b := range reply.Content {
		if b.Type == "tool_use" {
			results = append(results, anthropic.NewToolResultBlock(b.ID, toolOutput(b.ID), false))
		}
	}
	if len(results) > 0 {
		return anthropic.NewUserMessage(results...)
	}
	return anthropic.NewUserMessage(anthropic.NewTextBlock(fmt.Sprintf("Now step %d: look at the next directory.", i)))
}

// toolOutput is a tool's output of some 150 tokens.
func toolOutput(id string) string {
	var b strings.Builder
	for i := range 12 {
		fmt.Fprintf(&b, "drwxr-xr-x  %s/entry_%02d.go  4096 bytes  modified today\n", id, i)
	}
	return b.String()
}

// loopCheck follows an agent loop's upstream requests: between reductions
// each one must start with the previous one's messages byte for byte;
// where one does not, a reduction happened, and the request must hold
// fewer messages than the client sent and a stored summary or marker.
type loopCheck struct {
	prev   []string
	breaks int
}

// reductions checks, at the end of a loop, that the prefix changed at
// least "least" times and never without a reduction of conv behind it.
func (lc *loopCheck) reductions(t *testing.T, h *harness, conv string, least int) {
	t.Helper()
	st, err := h.c.Status(context.Background(), conv)
	if err != nil {
		t.Fatal(err)
	}
	if lc.breaks < least || lc.breaks > st.Condensations+st.Truncations {
		t.Fatalf("%d prefix changes for %d condensations and %d truncations", lc.breaks, st.Condensations, st.Truncations)
	}
}

func (lc *loopCheck) next(t *testing.T, step int, got []string, clientSent int, synthetic []string) {
	t.Helper()
	prefix := len(got) >= len(lc.prev)
	for i := 0; prefix && i < len(lc.prev); i++ {
		prefix = got[i] == lc.prev[i]
	}
	if !prefix {
		lc.breaks++
		if len(got) >= clientSent {
			t.Errorf("step %d: the prefix changed but the upstream got %d messages, the client sent %d", step, len(got), clientSent)
		}
		found := false
		for _, m := range got {
			for _, s := range synthetic {
				found = found || strings.Contains(m, s)
			}
		}
		if !found {
			t.Errorf("step %d: the prefix changed but no summary or marker went upstream", step)
		}
	}
	lc.prev = got
}

// syntheticTexts are the first lines of conv's summaries and markers, as
// JSON string content would hold them.
func (h *harness) syntheticTexts(t *testing.T, conv string) []string {
	var out []string
	for _, m := range h.full(t, conv) {
		if !m.Synthetic() {
			continue
		}
		text := m.Content.OwnText("\n")
		line, _, _ := strings.Cut(text, "\n")
		if len(line) > 40 {
			line = line[:40]
		}
		out = append(out, strings.Trim(js(line), `"`))
	}
	return out
}

func TestAnthropicAgentLoop(t *testing.T) {
	h := newHarness(t, nil)
	h.model.thinking = true
	c := h.anthClient(option.WithHeader("X-Claude-Code-Session-Id", "loop-1"))
	var msgs []anthropic.MessageParam
	msgs = append(msgs, anthropic.NewUserMessage(anthropic.NewTextBlock("Fix the failing test in pkg/x.")))
	var lc loopCheck
	sent := []int{}
	var reply anthropic.Message
	for i := range 40 {
		if i > 0 {
			msgs = append(msgs, anthNext(reply, i))
		}
		var hdr http.Header
		reply, hdr = anthStep(t, c, msgs, i%2 == 0)
		if got := hdr.Get("X-Ctxpipe-Conversation"); got != "loop-1" {
			t.Fatalf("step %d: conversation %q, want loop-1", i, got)
		}
		ctxTok, _ := strconv.Atoi(hdr.Get("X-Ctxpipe-Context-Tokens"))
		origTok, _ := strconv.Atoi(hdr.Get("X-Ctxpipe-Original-Tokens"))
		if ctxTok <= 0 || origTok < ctxTok {
			t.Errorf("step %d: context %d tokens, original %d", i, ctxTok, origTok)
		}
		msgs = append(msgs, reply.ToParam())
		sent = append(sent, len(msgs)-1)
	}
	reqs := h.model.requests()
	if len(reqs) != 40 {
		t.Fatalf("the upstream got %d requests, want 40", len(reqs))
	}
	synth := h.syntheticTexts(t, "loop-1")
	for i, r := range reqs {
		if r.header.Get("X-Api-Key") != "ak-upstream" {
			t.Fatalf("request %d: the upstream key was not set", i)
		}
		lc.next(t, i, r.list(t), sent[i], synth)
	}
	st, err := h.c.Status(context.Background(), "loop-1")
	if err != nil {
		t.Fatal(err)
	}
	if lc.breaks < 2 || st.Condensations+st.Truncations < 2 {
		t.Fatalf("%d prefix changes, %d condensations, %d truncations: want the threshold crossed at least twice", lc.breaks, st.Condensations, st.Truncations)
	}
	if lc.breaks > st.Condensations+st.Truncations {
		t.Errorf("%d prefix changes for %d reductions: the prefix changed without a reduction", lc.breaks, st.Condensations+st.Truncations)
	}
	// Every turn recorded once: the client's 40 requests hold 80 turns.
	if agent := h.agentTurns(t, "loop-1", 80); agent != 80 {
		t.Errorf("%d agent turns recorded, want 80", agent)
	}
	if rej := h.rejected(t, "loop-1"); len(rej) > 0 {
		t.Errorf("rejected inputs: %v", rej)
	}
	// The signed thinking reached the upstream again, signature and all.
	last := reqs[len(reqs)-1].list(t)
	if s := last[len(last)-2]; !strings.Contains(s, `"signature":"EqQBCkYIARgCKkD+sig/`) || !strings.Contains(s, `"type":"thinking"`) {
		t.Errorf("the last assistant turn went upstream without its signed thinking: %s", s)
	}
	t.Logf("%d reductions (%d condensations, %d truncations), context %d of %d tokens at the end",
		lc.breaks, st.Condensations, st.Truncations, st.ContextTokens, st.ContextWindow)
	_ = schema.RoleUser
}
