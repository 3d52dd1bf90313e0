package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/ctxpipe/ctxpipe/schema"
)

// chatAPI is the Chat Completions API (POST /v1/chat/completions).
type chatAPI struct{}

// chatMessage is a message of the Chat Completions API, as far as the
// proxy reads it.
type chatMessage struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	Refusal    string          `json:"refusal"`
	ToolCalls  []chatToolCall  `json:"tool_calls"`
	ToolCallID string          `json:"tool_call_id"`
}

type chatToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// contentBlocks reads a content value that is a string, null or an array
// of parts into blocks: each part is decoded into a P, and part reads it
// (with the part's raw JSON) into a block.
func contentBlocks[P any](raw []byte, part func(p *P, e []byte) schema.Block) ([]schema.Block, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("%w: content: %v", errBadJSON, err)
		}
		return []schema.Block{{Type: schema.BlockText, Text: s}}, nil
	}
	elems, err := splitArray(raw)
	if err != nil {
		return nil, fmt.Errorf("content: %w", err)
	}
	var out []schema.Block
	for _, e := range elems {
		var p P
		if err := json.Unmarshal(e, &p); err != nil {
			return nil, fmt.Errorf("%w: content part: %v", errBadJSON, err)
		}
		out = append(out, part(&p, e))
	}
	return out, nil
}

// chatPart is a content part of the Chat Completions API.
type chatPart struct {
	Type     string `json:"type"`
	Text     string `json:"text"`
	Refusal  string `json:"refusal"`
	ImageURL struct {
		URL string `json:"url"`
	} `json:"image_url"`
}

// chatParts reads a Chat Completions content value into blocks.
func chatParts(raw []byte) ([]schema.Block, error) {
	return contentBlocks(raw, func(p *chatPart, e []byte) schema.Block {
		switch {
		case p.Type == "text":
			return schema.Block{Type: schema.BlockText, Text: p.Text}
		case p.Type == "refusal":
			return schema.Block{Type: schema.BlockText, Text: p.Refusal}
		case p.Type == "image_url" && p.ImageURL.URL != "":
			return imageBlock(p.ImageURL.URL)
		default:
			return rawText(e)
		}
	})
}

// imageBlock is an image given by URL, a data: URL being base64 data.
func imageBlock(url string) schema.Block {
	if rest, ok := strings.CutPrefix(url, "data:"); ok {
		if mt, data, ok := strings.Cut(rest, ";base64,"); ok && data != "" {
			return schema.Block{Type: schema.BlockImage, Source: &schema.ImageSource{Type: "base64", MediaType: mt, Data: data}}
		}
	}
	return schema.Block{Type: schema.BlockImage, Source: &schema.ImageSource{Type: "url", URL: url}}
}

// chatTurn reads one user, assistant or tool message into a turn.
func chatTurn(m *chatMessage, raw jsontext.Value) (turnMsg, error) {
	var role schema.Role
	switch m.Role {
	case "user", "tool":
		role = schema.RoleUser
	case "assistant":
		role = schema.RoleAssistant
	default:
		return turnMsg{}, fmt.Errorf("unknown role %q (want system, developer, user, assistant or tool)", clip(m.Role, 40))
	}
	if m.Role == "tool" && m.ToolCallID == "" {
		return turnMsg{}, fmt.Errorf("a tool message needs its tool_call_id")
	}
	blocks, err := chatParts(m.Content)
	if err != nil {
		return turnMsg{}, err
	}
	switch m.Role {
	case "assistant":
		if m.Refusal != "" {
			blocks = append(blocks, schema.Block{Type: schema.BlockText, Text: m.Refusal})
		}
		for _, tc := range m.ToolCalls {
			if tc.ID == "" || tc.Function.Name == "" {
				blocks = append(blocks, rawText(marshal(tc)))
				continue
			}
			blocks = append(blocks, schema.Block{Type: schema.BlockToolUse, ID: tc.ID, Name: tc.Function.Name, Input: toolInput(tc.Function.Arguments)})
		}
	case "tool":
		inner := flatResult(schema.BlockContent(blocks...))
		blocks = []schema.Block{{Type: schema.BlockToolResult, ToolUseID: m.ToolCallID, Content: &inner}}
	}
	c := schema.BlockContent(blocks...)
	return turnMsg{role: role, content: c, canon: canonOf(role, c, nil), raw: []jsontext.Value{raw}}, nil
}

func (chatAPI) parse(o *object) (*request, error) {
	r := &request{obj: o, list: "messages"}
	var top struct {
		Stream         bool   `json:"stream"`
		PromptCacheKey string `json:"prompt_cache_key"`
	}
	if err := json.Unmarshal(o.raw, &top); err != nil {
		return nil, fmt.Errorf("%w: %v", errBadJSON, err)
	}
	r.stream, r.keys.PromptCacheKey = top.Stream, top.PromptCacheKey
	elems, err := o.messages()
	if err != nil {
		return nil, err
	}
	p := systemPlacer{req: r}
	for i, e := range elems {
		var m chatMessage
		if err := json.Unmarshal(e, &m); err != nil {
			return nil, fmt.Errorf("%w: messages[%d]: %v", errBadJSON, i, err)
		}
		if m.Role == "system" || m.Role == "developer" {
			b, err := chatParts(m.Content)
			if err != nil {
				return nil, fmt.Errorf("messages[%d]: %w", i, err)
			}
			p.system(e, schema.BlockContent(b...).OwnText("\n"))
			continue
		}
		t, err := chatTurn(&m, e)
		if err != nil {
			return nil, fmt.Errorf("messages[%d]: %w", i, err)
		}
		p.turn(t)
	}
	p.finish()
	return r, nil
}

func (chatAPI) render(m *schema.Message) []jsontext.Value {
	if out, ok := renderPlain(m, roleContent); ok {
		return out
	}
	var out []jsontext.Value
	var text []string
	var parts []map[string]any
	var calls []map[string]any
	for _, b := range m.Content.Blocks {
		switch b.Type {
		case schema.BlockText:
			if b.Text != "" {
				text = append(text, b.Text)
				parts = append(parts, map[string]any{"type": "text", "text": b.Text})
			}
		case schema.BlockImage:
			if m.Role == schema.RoleUser && b.Source != nil {
				url := b.Source.URL
				if b.Source.Type == "base64" {
					url = "data:" + b.Source.MediaType + ";base64," + b.Source.Data
				}
				parts = append(parts, map[string]any{"type": "image_url", "image_url": map[string]any{"url": url}})
			}
		case schema.BlockToolUse:
			args := string(b.Input)
			var s string
			if json.Unmarshal(b.Input, &s) == nil {
				args = s // arguments that were not JSON went in as a string
			}
			calls = append(calls, map[string]any{"id": b.ID, "type": "function", "function": map[string]any{"name": b.Name, "arguments": args}})
		case schema.BlockToolResult:
			content := ""
			if b.Content != nil {
				content = b.Content.OwnText("\n")
			}
			out = append(out, marshal(map[string]any{"role": "tool", "tool_call_id": b.ToolUseID, "content": content}))
		}
	}
	switch {
	case m.Role == schema.RoleAssistant && (len(text) > 0 || len(calls) > 0):
		msg := map[string]any{"role": "assistant", "content": strings.Join(text, "\n\n")}
		if len(calls) > 0 {
			msg["tool_calls"] = calls
		}
		out = append(out, marshal(msg))
	case m.Role == schema.RoleUser && len(parts) > 0:
		out = append(out, marshal(map[string]any{"role": "user", "content": parts}))
	}
	return out
}

// chatUsage is the Chat Completions API's usage.
type chatUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

func (chatAPI) reply(body []byte, sse bool) (turnMsg, *schema.Usage, bool) {
	var msg chatMessage
	var usage *chatUsage
	if !sse {
		var r struct {
			Choices []struct {
				Message chatMessage `json:"message"`
			} `json:"choices"`
			Usage *chatUsage `json:"usage"`
		}
		if json.Unmarshal(body, &r) != nil || len(r.Choices) == 0 {
			return turnMsg{}, nil, false
		}
		msg, usage = r.Choices[0].Message, r.Usage
	} else {
		var text, refusal strings.Builder
		var calls []chatToolCall
		done := false
		for _, ev := range sseEvents(body) {
			if string(ev.data) == "[DONE]" {
				done = true
				continue
			}
			var c struct {
				Choices []struct {
					Index int `json:"index"`
					Delta struct {
						Content   *string `json:"content"`
						Refusal   *string `json:"refusal"`
						ToolCalls []struct {
							Index int `json:"index"`
							chatToolCall
						} `json:"tool_calls"`
					} `json:"delta"`
				} `json:"choices"`
				Usage *chatUsage `json:"usage"`
			}
			if json.Unmarshal(ev.data, &c) != nil {
				continue
			}
			if c.Usage != nil {
				usage = c.Usage
			}
			for _, ch := range c.Choices {
				if ch.Index != 0 {
					continue
				}
				if ch.Delta.Content != nil {
					text.WriteString(*ch.Delta.Content)
				}
				if ch.Delta.Refusal != nil {
					refusal.WriteString(*ch.Delta.Refusal)
				}
				for _, tc := range ch.Delta.ToolCalls {
					if tc.Index < 0 || tc.Index > len(calls) {
						return turnMsg{}, nil, false
					}
					if tc.Index == len(calls) {
						calls = append(calls, chatToolCall{})
					}
					call := &calls[tc.Index]
					if tc.ID != "" {
						call.ID = tc.ID
					}
					if tc.Type != "" {
						call.Type = tc.Type
					}
					call.Function.Name += tc.Function.Name
					call.Function.Arguments += tc.Function.Arguments
				}
			}
		}
		if !done {
			return turnMsg{}, nil, false
		}
		msg = chatMessage{Role: "assistant", Content: jsonString(text.String()), Refusal: refusal.String(), ToolCalls: calls}
	}
	if msg.Role == "" {
		msg.Role = "assistant"
	}
	t, err := chatTurn(&msg, marshal(msg))
	if err != nil || t.role != schema.RoleAssistant {
		return turnMsg{}, nil, false
	}
	var u *schema.Usage
	if usage != nil {
		u = usageOf(usage.PromptTokens, usage.CompletionTokens)
	}
	return t, u, true
}

func (chatAPI) errorBody(status int, msg string) []byte { return openaiError(status, msg) }

// openaiError is an error in the OpenAI APIs' format.
func openaiError(status int, msg string) []byte {
	typ := "server_error"
	switch status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		typ = "invalid_request_error"
	case http.StatusNotFound:
		typ = "not_found_error"
	case http.StatusGatewayTimeout:
		typ = "timeout"
	}
	return marshal(map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": nil}})
}
