package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"
)

func (h *harness) openaiClient(opts ...option.RequestOption) openai.Client {
	return openai.NewClient(append([]option.RequestOption{option.WithBaseURL(h.srv.URL + "/v1"), option.WithAPIKey("client-key"),
		option.WithMaxRetries(0)}, opts...)...)
}

var chatTools = []openai.ChatCompletionToolUnionParam{
	openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "bash", Parameters: shared.FunctionParameters{"type": "object"}}),
	openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "read_file", Parameters: shared.FunctionParameters{"type": "object"}}),
}

// chatOnce sends params, streamed or not, and returns the reply's message
// (for a stream, as the SDK's accumulator puts it together).
func chatOnce(t *testing.T, c openai.Client, params openai.ChatCompletionNewParams, stream bool, opts ...option.RequestOption) openai.ChatCompletionMessage {
	t.Helper()
	ctx := context.Background()
	if !stream {
		r, err := c.Chat.Completions.New(ctx, params, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return r.Choices[0].Message
	}
	s := c.Chat.Completions.NewStreaming(ctx, params, opts...)
	var acc openai.ChatCompletionAccumulator
	for s.Next() {
		acc.AddChunk(s.Current())
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	return acc.Choices[0].Message
}

func TestChatAgentLoop(t *testing.T) {
	h := newHarness(t, nil)
	c := h.openaiClient(option.WithHeader("X-Session-Id", "chat-1"))
	msgs := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("You are a careful coding agent."), openai.UserMessage("Fix the failing test in pkg/x.")}
	var lc loopCheck
	var sent []int
	for i := range 40 {
		params := openai.ChatCompletionNewParams{Model: "test-model", Messages: msgs, Tools: chatTools,
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}}
		var resp *http.Response
		stream := i%2 == 1
		if !stream {
			params.StreamOptions = openai.ChatCompletionStreamOptionsParam{}
		}
		msg := chatOnce(t, c, params, stream, option.WithResponseInto(&resp))
		if got := resp.Header.Get("X-Ctxpipe-Conversation"); got != "chat-1" {
			t.Fatalf("step %d: conversation %q", i, got)
		}
		sent = append(sent, len(msgs))
		msgs = append(msgs, msg.ToParam())
		if len(msg.ToolCalls) > 0 {
			if len(msg.ToolCalls) != 2 {
				t.Fatalf("step %d: %d parallel calls, want 2", i, len(msg.ToolCalls))
			}
			for _, tc := range msg.ToolCalls {
				msgs = append(msgs, openai.ToolMessage(toolOutput(tc.ID), tc.ID))
			}
		} else {
			msgs = append(msgs, openai.UserMessage(fmt.Sprintf("Now step %d.", i)))
		}
	}
	synth := h.syntheticTexts(t, "chat-1")
	for i, r := range h.model.requests() {
		if r.header.Get("Authorization") != "Bearer sk-upstream" {
			t.Fatalf("request %d: the upstream key was not set", i)
		}
		lc.next(t, i, r.list(t), sent[i], synth)
	}
	lc.reductions(t, h, "chat-1", 2)
	// The first user message, 40 replies, the two tool messages after each
	// of the 20 that call tools, and a user message after each of the 19
	// text replies before the last.
	if n := h.agentTurns(t, "chat-1", 100); n != 100 {
		t.Errorf("%d agent turns recorded, want 100", n)
	}
	if rej := h.rejected(t, "chat-1"); len(rej) > 0 {
		t.Errorf("rejected: %v", rej)
	}
}

func TestResponsesAgentLoop(t *testing.T) {
	h := newHarness(t, nil)
	c := h.openaiClient(option.WithHeader("session_id", "resp-1"))
	input := []json.RawMessage{json.RawMessage(`{"type":"message","role":"user","content":[{"type":"input_text","text":"Fix the failing test."}]}`)}
	ctx := context.Background()
	var lc loopCheck
	var sent []int
	for i := range 30 {
		params := responses.ResponseNewParams{Model: "test-model", Store: openai.Bool(false), Instructions: openai.String("You are a coding agent.")}
		var out []responses.ResponseOutputItemUnion
		var resp *http.Response
		opts := []option.RequestOption{option.WithJSONSet("input", input), option.WithResponseInto(&resp)}
		if i%2 == 0 {
			r, err := c.Responses.New(ctx, params, opts...)
			if err != nil {
				t.Fatal(err)
			}
			out = r.Output
		} else {
			s := c.Responses.NewStreaming(ctx, params, opts...)
			for s.Next() {
				if ev := s.Current(); ev.Type == "response.completed" {
					out = ev.Response.Output
				}
			}
			if err := s.Err(); err != nil {
				t.Fatal(err)
			}
		}
		if got := resp.Header.Get("X-Ctxpipe-Conversation"); got != "resp-1" {
			t.Fatalf("step %d: conversation %q", i, got)
		}
		sent = append(sent, len(input))
		calls := 0
		for _, item := range out {
			input = append(input, json.RawMessage(item.RawJSON()))
		}
		for _, item := range out {
			if item.Type == "function_call" {
				calls++
				input = append(input, json.RawMessage(fmt.Sprintf(`{"type":"function_call_output","call_id":%q,"output":%s}`, item.CallID, js(toolOutput(item.CallID)))))
			}
		}
		if calls == 0 {
			input = append(input, json.RawMessage(fmt.Sprintf(`{"role":"user","content":"Now step %d."}`, i)))
		}
	}
	synth := h.syntheticTexts(t, "resp-1")
	for i, r := range h.model.requests() {
		lc.next(t, i, r.list(t), sent[i], synth)
	}
	lc.reductions(t, h, "resp-1", 1)
	if rej := h.rejected(t, "resp-1"); len(rej) > 0 {
		t.Errorf("rejected: %v", rej)
	}
}

// A client may close a stream as soon as its last event arrived, before the
// upstream's body ends: the proxy's read of the upstream then fails (the
// request's context is the client's), but the reply came whole and is
// recorded. A stream cut before its last event is not: the reply parsers
// take a stream only with its final event.
func TestStreamLeftAfterItsLastEventIsRecorded(t *testing.T) {
	h := newHarness(t, nil)
	h.model.mu.Lock()
	h.model.linger = true // the upstream never ends the body by itself
	h.model.mu.Unlock()
	c := h.openaiClient(option.WithHeader("X-Ctxpipe-Conversation", "left-1"))
	ctx, cancel := context.WithCancel(context.Background())
	s := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "test-model",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("List the files.")}, Tools: chatTools})
	var acc openai.ChatCompletionAccumulator
	for s.Next() {
		acc.AddChunk(s.Current())
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	// The client got [DONE] and leaves; the body has not ended.
	s.Close()
	cancel()
	if len(acc.Choices) == 0 || len(acc.Choices[0].Message.ToolCalls) != 2 {
		t.Fatalf("the client got %+v", acc.Choices)
	}
	if n := h.agentTurns(t, "left-1", 2); n != 2 {
		t.Fatalf("%d turns recorded, want the user's and the reply", n)
	}
	msgs := h.full(t, "left-1")
	if last := msgs[len(msgs)-1]; last.Role != "assistant" || len(last.Content.Blocks) == 0 {
		t.Fatalf("the last message recorded is %+v, want the reply", last)
	}
}
