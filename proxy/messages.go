package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/ctxpipe/ctxpipe/schema"
)

// messagesAPI is the Messages API (POST /v1/messages).
type messagesAPI struct{}

// anthBlock is a content block of the Messages API, as far as the proxy
// reads it; the client's bytes are what is forwarded.
type anthBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	Thinking  string          `json:"thinking"`
	Signature string          `json:"signature"`
	Data      string          `json:"data"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	IsError   bool            `json:"is_error"`
	Source    *struct {
		Type      string `json:"type"`
		MediaType string `json:"media_type"`
		Data      string `json:"data"`
		URL       string `json:"url"`
	} `json:"source"`
}

// anthContent reads a content value (a string or blocks) into the wire
// contract's content and the opaque signatures of its thinking.
func anthContent(raw []byte, role schema.Role) (schema.Content, []string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return schema.TextContent(""), nil, nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return schema.Content{}, nil, fmt.Errorf("%w: content: %v", errBadJSON, err)
		}
		return schema.TextContent(s), nil, nil
	}
	elems, err := splitArray(raw)
	if err != nil {
		return schema.Content{}, nil, fmt.Errorf("content: %w", err)
	}
	var blocks []schema.Block
	var sigs []string
	for _, e := range elems {
		var b anthBlock
		if err := json.Unmarshal(e, &b); err != nil {
			return schema.Content{}, nil, fmt.Errorf("%w: content block: %v", errBadJSON, err)
		}
		switch b.Type {
		case "text":
			blocks = append(blocks, schema.Block{Type: schema.BlockText, Text: b.Text})
		case "thinking":
			blocks = append(blocks, schema.Block{Type: schema.BlockReasoning, Text: b.Thinking})
			sigs = append(sigs, b.Signature)
		case "redacted_thinking":
			blocks = append(blocks, schema.Block{Type: schema.BlockReasoning, Text: "[redacted thinking]"})
			sigs = append(sigs, b.Data)
		case "image":
			if b.Source == nil || (b.Source.Data == "" && b.Source.URL == "") {
				blocks = append(blocks, rawText(e))
				continue
			}
			blocks = append(blocks, schema.Block{Type: schema.BlockImage, Source: &schema.ImageSource{
				Type: b.Source.Type, MediaType: b.Source.MediaType, Data: b.Source.Data, URL: b.Source.URL}})
		case "tool_use":
			if role != schema.RoleAssistant || b.ID == "" || b.Name == "" {
				blocks = append(blocks, rawText(e))
				continue
			}
			in := compactJSON(b.Input)
			if len(in) == 0 {
				in = json.RawMessage("{}")
			}
			blocks = append(blocks, schema.Block{Type: schema.BlockToolUse, ID: b.ID, Name: b.Name, Input: in})
		case "tool_result":
			if role != schema.RoleUser || b.ToolUseID == "" {
				blocks = append(blocks, rawText(e))
				continue
			}
			inner, _, err := anthContent(b.Content, schema.RoleUser)
			if err != nil {
				return schema.Content{}, nil, err
			}
			inner = flatResult(inner)
			blocks = append(blocks, schema.Block{Type: schema.BlockToolResult, ToolUseID: b.ToolUseID, Content: &inner, IsError: b.IsError})
		default:
			// documents, search results, server tools' blocks: recorded as
			// their JSON.
			blocks = append(blocks, rawText(e))
		}
	}
	return schema.BlockContent(blocks...), sigs, nil
}

// flatResult keeps a tool result's content within what the wire contract
// allows there: text and image blocks; anything else becomes text.
func flatResult(c schema.Content) schema.Content {
	if !c.IsBlocks {
		return c
	}
	out := make([]schema.Block, 0, len(c.Blocks))
	for _, b := range c.Blocks {
		switch b.Type {
		case schema.BlockText, schema.BlockImage:
			out = append(out, b)
		default:
			out = append(out, schema.Block{Type: schema.BlockText, Text: string(marshal(b))})
		}
	}
	return schema.BlockContent(out...)
}

func (messagesAPI) parse(o *object) (*request, error) {
	r := &request{obj: o, list: "messages"}
	var top struct {
		System   json.RawMessage `json:"system"`
		Stream   bool            `json:"stream"`
		Metadata struct {
			UserID string `json:"user_id"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(o.raw, &top); err != nil {
		return nil, fmt.Errorf("%w: %v", errBadJSON, err)
	}
	r.stream, r.keys.MetadataUserID = top.Stream, top.Metadata.UserID
	if len(top.System) > 0 && string(top.System) != "null" {
		c, _, err := anthContent(top.System, schema.RoleUser)
		if err != nil {
			return nil, fmt.Errorf("system: %w", err)
		}
		r.system = c.OwnText("\n")
	}
	elems, err := o.messages()
	if err != nil {
		return nil, err
	}
	p := systemPlacer{req: r}
	for i, e := range elems {
		var m struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		if err := json.Unmarshal(e, &m); err != nil {
			return nil, fmt.Errorf("%w: messages[%d]: %v", errBadJSON, i, err)
		}
		switch m.Role {
		case "system":
			c, _, err := anthContent(m.Content, schema.RoleUser)
			if err != nil {
				return nil, fmt.Errorf("messages[%d]: %w", i, err)
			}
			p.system(e, c.OwnText("\n"))
		case "user", "assistant":
			role := schema.Role(m.Role)
			c, sigs, err := anthContent(m.Content, role)
			if err != nil {
				return nil, fmt.Errorf("messages[%d]: %w", i, err)
			}
			p.turn(turnMsg{role: role, content: c, canon: canonOf(role, c, sigs), raw: []jsontext.Value{e}})
		default:
			return nil, fmt.Errorf("messages[%d]: unknown role %q (want user, assistant or system)", i, clip(m.Role, 40))
		}
	}
	p.finish()
	return r, nil
}

// anthToolResult is a tool_result block as the Messages API writes it.
func anthToolResult(b schema.Block) map[string]any {
	tr := map[string]any{"type": "tool_result", "tool_use_id": b.ToolUseID}
	if b.Content != nil {
		tr["content"] = *b.Content
	}
	if b.IsError {
		tr["is_error"] = true
	}
	return tr
}

func (messagesAPI) render(m *schema.Message) []jsontext.Value {
	if out, ok := renderPlain(m, roleContent); ok {
		return out
	}
	var blocks []map[string]any
	for _, b := range m.Content.Blocks {
		switch b.Type {
		case schema.BlockText:
			if b.Text != "" {
				blocks = append(blocks, map[string]any{"type": "text", "text": b.Text})
			}
		case schema.BlockToolUse:
			blocks = append(blocks, map[string]any{"type": "tool_use", "id": b.ID, "name": b.Name, "input": b.Input})
		case schema.BlockToolResult:
			blocks = append(blocks, anthToolResult(b))
		case schema.BlockImage:
			blocks = append(blocks, map[string]any{"type": "image", "source": b.Source})
		}
		// Reasoning is left out: a provider refuses thinking it did not sign.
	}
	if len(blocks) == 0 {
		return nil
	}
	return []jsontext.Value{marshal(map[string]any{"role": m.Role, "content": blocks})}
}

// anthUsage is the Messages API's usage.
type anthUsage struct {
	InputTokens              int `json:"input_tokens"`
	OutputTokens             int `json:"output_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
}

// usage is the context the provider saw: every input token, cached or not,
// and the reply.
func (u anthUsage) usage() *schema.Usage {
	return usageOf(u.InputTokens+u.CacheCreationInputTokens+u.CacheReadInputTokens, u.OutputTokens)
}

func (messagesAPI) reply(body []byte, sse bool) (turnMsg, *schema.Usage, bool) {
	var msg struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
		Usage   anthUsage       `json:"usage"`
	}
	if !sse {
		if json.Unmarshal(body, &msg) != nil || msg.Role != "assistant" {
			return turnMsg{}, nil, false
		}
	} else {
		// Rebuild the message from its events.
		var blocks []map[string]any
		var inputs []string
		done := false
		for _, ev := range sseEvents(body) {
			var e struct {
				Type         string          `json:"type"`
				Index        int             `json:"index"`
				Message      json.RawMessage `json:"message"`
				ContentBlock map[string]any  `json:"content_block"`
				Delta        struct {
					Type        string `json:"type"`
					Text        string `json:"text"`
					PartialJSON string `json:"partial_json"`
					Thinking    string `json:"thinking"`
					Signature   string `json:"signature"`
				} `json:"delta"`
				Usage *anthUsage `json:"usage"`
			}
			if json.Unmarshal(ev.data, &e) != nil {
				continue
			}
			switch e.Type {
			case "message_start":
				if json.Unmarshal(e.Message, &msg) != nil {
					return turnMsg{}, nil, false
				}
			case "content_block_start":
				if e.Index != len(blocks) {
					return turnMsg{}, nil, false
				}
				blocks = append(blocks, e.ContentBlock)
				inputs = append(inputs, "")
			case "content_block_delta":
				if e.Index < 0 || e.Index >= len(blocks) {
					return turnMsg{}, nil, false
				}
				b := blocks[e.Index]
				switch e.Delta.Type {
				case "text_delta":
					b["text"] = str(b["text"]) + e.Delta.Text
				case "thinking_delta":
					b["thinking"] = str(b["thinking"]) + e.Delta.Thinking
				case "signature_delta":
					b["signature"] = e.Delta.Signature
				case "input_json_delta":
					inputs[e.Index] += e.Delta.PartialJSON
				}
			case "message_delta":
				if e.Usage != nil {
					if e.Usage.InputTokens > 0 {
						msg.Usage.InputTokens = e.Usage.InputTokens
					}
					if e.Usage.CacheReadInputTokens > 0 {
						msg.Usage.CacheReadInputTokens = e.Usage.CacheReadInputTokens
					}
					if e.Usage.CacheCreationInputTokens > 0 {
						msg.Usage.CacheCreationInputTokens = e.Usage.CacheCreationInputTokens
					}
					msg.Usage.OutputTokens = e.Usage.OutputTokens
				}
			case "message_stop":
				done = true
			}
		}
		if !done || msg.Role != "assistant" {
			return turnMsg{}, nil, false
		}
		for i, b := range blocks {
			if inputs[i] != "" {
				b["input"] = json.RawMessage(inputs[i])
			}
		}
		msg.Content = json.RawMessage(marshal(blocks))
	}
	c, sigs, err := anthContent(msg.Content, schema.RoleAssistant)
	if err != nil {
		return turnMsg{}, nil, false
	}
	raw := marshal(map[string]any{"role": "assistant", "content": msg.Content})
	return turnMsg{role: schema.RoleAssistant, content: c, canon: canonOf(schema.RoleAssistant, c, sigs), raw: []jsontext.Value{raw}}, msg.Usage.usage(), true
}

func (messagesAPI) errorBody(status int, msg string) []byte {
	typ := "api_error"
	switch {
	case status == http.StatusBadRequest:
		typ = "invalid_request_error"
	case status == http.StatusRequestEntityTooLarge:
		typ = "request_too_large"
	case status == http.StatusNotFound:
		typ = "not_found_error"
	case status == http.StatusGatewayTimeout:
		typ = "timeout_error"
	}
	return marshal(map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": msg}})
}

// usageOf is a usage the wire contract takes, or nil when the provider
// reported none.
func usageOf(in, out int) *schema.Usage {
	if in < 0 || out < 0 || in+out <= 0 || in+out > schema.MaxTokenCount {
		return nil
	}
	return &schema.Usage{InputTokens: in, OutputTokens: out}
}

// str is v when it is a string, else "".
func str(v any) string {
	s, _ := v.(string)
	return s
}
