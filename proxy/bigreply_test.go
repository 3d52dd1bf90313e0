package proxy

import (
	"context"
	"fmt"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/ctxpipe/ctxpipe/schema"
)

// A reply over MaxReplyBytes is relayed whole and not recorded; the
// client's next request holds it, and it is recorded from there, once.
func TestReplyOverTheBoundIsRelayedNotRecorded(t *testing.T) {
	if New(nil, Config{}).cfg.MaxReplyBytes != 64<<20 {
		t.Fatal("the default bound is not 64 MiB")
	}
	// Every reply of the harness's model is over 64 bytes.
	h := newHarness(t, func(c *Config) { c.MaxReplyBytes = 64 })
	ctx := context.Background()
	// Each conversation's second reply is the one never recorded: a
	// stream in one, JSON in the other.
	convs := map[string][]bool{"big-stream": {false, true}, "big-json": {true, false}}
	for conv, streams := range convs {
		c := h.openaiClient(option.WithHeader("X-Ctxpipe-Conversation", conv))
		msgs := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("List the files.")}
		for i, stream := range streams {
			params := openai.ChatCompletionNewParams{Model: "test-model", Messages: msgs, Tools: chatTools}
			msg := chatOnce(t, c, params, stream)
			// The client got the whole reply: the model's two parallel
			// calls first, then its text.
			if i == 0 && len(msg.ToolCalls) != 2 || i == 1 && msg.Content == "" {
				t.Fatalf("%s, request %d: the client got %+v", conv, i, msg)
			}
			msgs = append(msgs, msg.ToParam())
			for _, tc := range msg.ToolCalls {
				msgs = append(msgs, openai.ToolMessage(toolOutput(tc.ID), tc.ID))
			}
		}
	}
	// Once the proxy's handlers have returned, whatever they recorded is
	// published; a turn appended after it, once applied, has everything
	// before it applied (a conversation's inputs apply in order).
	h.srv.Close()
	for conv := range convs {
		id, err := h.c.Append(ctx, schema.Turn{ConversationID: conv, Role: schema.RoleUser, Content: schema.TextContent("done")})
		if err == nil {
			err = h.c.Wait(ctx, conv, id)
		}
		if err != nil {
			t.Fatal(err)
		}
		// Recorded: the user's message; the first reply and its two
		// tool results, from the second request; not the second reply;
		// the last turn.
		var roles []schema.Role
		for _, m := range h.full(t, conv) {
			if !m.Synthetic() {
				roles = append(roles, m.Role)
			}
		}
		want := []schema.Role{schema.RoleUser, schema.RoleAssistant, schema.RoleUser, schema.RoleUser, schema.RoleUser}
		if fmt.Sprint(roles) != fmt.Sprint(want) {
			t.Errorf("%s: recorded %v, want %v", conv, roles, want)
		}
		if rej := h.rejected(t, conv); len(rej) > 0 {
			t.Errorf("%s: rejected: %v", conv, rej)
		}
	}
}
