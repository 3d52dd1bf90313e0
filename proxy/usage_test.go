package proxy

import (
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
)

// compactingAgent is an agent that manages its own context by the usage
// its provider reports, as Claude Code and Codex do: when the input tokens
// of a reply exceed its window, it would compact its history itself. The
// loop here stops there instead and reports the step (-1: never).
func compactingAgent(t *testing.T, c anthropic.Client, window, steps int) (compactedAt, maxInput int) {
	t.Helper()
	msgs := []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Fix the failing test in pkg/x."))}
	var reply anthropic.Message
	for i := range steps {
		if i > 0 {
			msgs = append(msgs, anthNext(reply, i))
		}
		reply, _ = anthStep(t, c, msgs, i%2 == 1)
		u := reply.Usage
		in := int(u.InputTokens + u.CacheCreationInputTokens + u.CacheReadInputTokens)
		maxInput = max(maxInput, in)
		if in > window {
			return i, maxInput
		}
		msgs = append(msgs, reply.ToParam())
	}
	return -1, maxInput
}

// TestClientNeedNotCompact runs an agent that compacts by the usage it is
// told, with the window of the conversation's profile, against an upstream
// whose usage counts what it received (a quarter of the bytes of the
// message list). Straight to the upstream, the agent reaches its window
// and would compact itself; through the proxy, the same loop three times
// as long runs to its end, because ctxpipe's reductions keep what goes
// upstream under the window.
func TestClientNeedNotCompact(t *testing.T) {
	h := newHarness(t, nil)
	window := smallWindow().ContextWindow

	direct := anthropic.NewClient(option.WithBaseURL(h.model.srv.URL), option.WithAPIKey("client-key"), option.WithMaxRetries(0))
	at, _ := compactingAgent(t, direct, window, 60)
	if at < 0 {
		t.Fatalf("straight to the upstream the agent never reached its window of %d tokens: the loop is too short to show anything", window)
	}
	steps := 3 * at
	t.Logf("straight to the upstream, the agent would compact itself at step %d; through the proxy it runs %d steps", at, steps)

	c := h.anthClient(option.WithHeader("X-Claude-Code-Session-Id", "usage-1"))
	if at, maxIn := compactingAgent(t, c, window, steps); at >= 0 {
		t.Fatalf("through the proxy the upstream reported %d input tokens at step %d, over the window of %d: the agent would compact itself", maxIn, at, window)
	} else {
		t.Logf("through the proxy the upstream reported at most %d input tokens (window %d)", maxIn, window)
	}
	if agent := h.agentTurns(t, "usage-1", 2*steps); agent != 2*steps {
		t.Errorf("%d agent turns recorded, want %d", agent, 2*steps)
	}
}
