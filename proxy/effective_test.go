package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/ctxpipe/ctxpipe/schema"
)

// said is what a message says to the model, part by part, in a form that a
// Messages API message and a stored message both reduce to: its text,
// reasoning, tool calls and tool results (their text joined), in order.
type said struct {
	role  string
	parts []string
}

func (s said) String() string { return s.role + " " + strings.Join(s.parts, " | ") }

// saidWire reads a Messages API message as the upstream received it.
func saidWire(t *testing.T, elem []byte) said {
	t.Helper()
	var m struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(elem, &m); err != nil {
		t.Fatalf("a forwarded message is not JSON: %v", err)
	}
	return said{role: m.Role, parts: wireParts(t, m.Content)}
}

func wireParts(t *testing.T, content json.RawMessage) []string {
	t.Helper()
	var s string
	if json.Unmarshal(content, &s) == nil {
		if s == "" {
			return nil
		}
		return []string{"text:" + s}
	}
	var blocks []anthBlock
	if err := json.Unmarshal(content, &blocks); err != nil {
		t.Fatalf("forwarded content %s: %v", clip(string(content), 200), err)
	}
	var out []string
	for _, b := range blocks {
		switch b.Type {
		case "text":
			if b.Text != "" {
				out = append(out, "text:"+b.Text)
			}
		case "thinking":
			out = append(out, "reasoning:"+b.Thinking)
		case "tool_use":
			out = append(out, fmt.Sprintf("tool_use:%s:%s:%s", b.ID, b.Name, compactJSON(b.Input)))
		case "tool_result":
			var text []string
			for _, p := range wireParts(t, b.Content) {
				text = append(text, strings.TrimPrefix(p, "text:"))
			}
			out = append(out, fmt.Sprintf("tool_result:%s:%t:%s", b.ToolUseID, b.IsError, strings.Join(text, "\n")))
		default:
			out = append(out, "other:"+b.Type)
		}
	}
	return out
}

// saidStored reads a stored message the same way. Reasoning of a message
// ctxpipe made is left out, as it is never forwarded (no provider would
// take thinking it did not sign).
func saidStored(m *schema.Message) said {
	return said{role: string(m.Role), parts: storedParts(m.Content, !m.Synthetic())}
}

func storedParts(c schema.Content, reasoning bool) []string {
	if !c.IsBlocks {
		if c.Text == "" {
			return nil
		}
		return []string{"text:" + c.Text}
	}
	var out []string
	for _, b := range c.Blocks {
		switch b.Type {
		case schema.BlockText:
			if b.Text != "" {
				out = append(out, "text:"+b.Text)
			}
		case schema.BlockReasoning:
			if reasoning {
				out = append(out, "reasoning:"+b.Text)
			}
		case schema.BlockToolUse:
			out = append(out, fmt.Sprintf("tool_use:%s:%s:%s", b.ID, b.Name, compactJSON(b.Input)))
		case schema.BlockToolResult:
			var text []string
			if b.Content != nil {
				for _, p := range storedParts(*b.Content, false) {
					text = append(text, strings.TrimPrefix(p, "text:"))
				}
			}
			out = append(out, fmt.Sprintf("tool_result:%s:%t:%s", b.ToolUseID, b.IsError, strings.Join(text, "\n")))
		default:
			out = append(out, "other:"+string(b.Type))
		}
	}
	return out
}

// sameHistory compares, message by message, what the upstream received
// with the effective history the service held when it received it; it
// returns how many of the messages were ctxpipe's own (summaries, markers,
// masked stand-ins).
func sameHistory(t *testing.T, step int, got []string, eff []schema.Message) (synthetic int) {
	t.Helper()
	var want []said
	for i := range eff {
		s := saidStored(&eff[i])
		if len(s.parts) == 0 {
			continue // nothing the model reads: the proxy writes no message for it
		}
		want = append(want, s)
		if eff[i].Synthetic() {
			synthetic++
		}
	}
	if len(got) != len(want) {
		t.Errorf("step %d: the upstream got %d messages, the effective history holds %d", step, len(got), len(want))
	}
	for i := range min(len(got), len(want)) {
		if g := saidWire(t, []byte(got[i])); g.role != want[i].role || !slices.Equal(g.parts, want[i].parts) {
			t.Errorf("step %d, message %d:\n upstream got  %s\n effective has %s", step, i, clip(g.String(), 300), clip(want[i].String(), 300))
		}
	}
	return synthetic
}

// TestUpstreamGetsEffectiveHistory follows an Anthropic SDK agent loop of
// 40 turns whose context crosses the threshold more than once: each time
// the upstream is called, it reads the conversation's effective history
// from the service (the proxy has read it and waits for the answer, so
// nothing else changes it meanwhile) and keeps it with what it received;
// the two must say the same, message by message, before and after every
// reduction.
func TestUpstreamGetsEffectiveHistory(t *testing.T) {
	h := newHarness(t, nil)
	h.model.thinking = true
	const conv = "eff-1"
	var mu sync.Mutex
	var views [][]schema.Message
	h.model.inspect = func(r *http.Request, body []byte) {
		eff, err := h.c.History(r.Context(), r.Header.Get("X-Claude-Code-Session-Id"))
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			t.Errorf("effective history at request %d: %v", len(views), err)
			views = append(views, nil)
			return
		}
		views = append(views, eff.Messages)
	}
	c := h.anthClient(option.WithHeader("X-Claude-Code-Session-Id", conv))
	msgs := []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Fix the failing test in pkg/x."))}
	var reply anthropic.Message
	for i := range 40 {
		if i > 0 {
			msgs = append(msgs, anthNext(reply, i))
		}
		reply, _ = anthStep(t, c, msgs, i%2 == 1)
		msgs = append(msgs, reply.ToParam())
	}
	reqs := h.model.requests()
	if len(reqs) != 40 || len(views) != 40 {
		t.Fatalf("%d requests, %d views: want 40", len(reqs), len(views))
	}
	var prev []string
	reduced, checked := 0, 0
	for i, r := range reqs {
		got := r.list(t)
		synthetic := sameHistory(t, i, got, views[i])
		extends := len(got) >= len(prev) && slices.Equal(got[:len(prev)], prev)
		if !extends {
			reduced++
			if synthetic == 0 {
				t.Errorf("step %d: the prefix changed, and the effective history holds nothing of ctxpipe's", i)
			}
		}
		if synthetic > 0 {
			checked++
		}
		prev = got
	}
	st, err := h.c.Status(context.Background(), conv)
	if err != nil {
		t.Fatal(err)
	}
	if reduced < 2 || st.Condensations+st.Truncations < 2 {
		t.Fatalf("%d prefix changes, %d condensations, %d truncations: want the threshold crossed twice", reduced, st.Condensations, st.Truncations)
	}
	t.Logf("%d requests compared with the effective history, %d of them holding ctxpipe's messages (%d reductions)", len(reqs), checked, reduced)
	if !bytes.Contains(reqs[len(reqs)-1].body, []byte(`"thinking"`)) {
		t.Errorf("the last request lost the signed thinking of the turns the client still holds")
	}
}
