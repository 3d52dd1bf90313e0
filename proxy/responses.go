package proxy

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/ctxpipe/ctxpipe/schema"
)

// responsesAPI is the Responses API (POST /v1/responses), stateless: the
// whole history travels in input. Its items map onto turns this way: a user
// message is a user turn; each *_call_output item is a user turn holding
// one tool result; a run of output items (reasoning, an assistant message,
// *_call items) is one assistant turn, as one response produced it.
type responsesAPI struct{}

// respItem is an item of input or output, as far as the proxy reads it.
type respItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments *string         `json:"arguments"`
	Input     json.RawMessage `json:"input"`
	Action    json.RawMessage `json:"action"`
	Output    json.RawMessage `json:"output"`
	Summary   []struct {
		Text string `json:"text"`
	} `json:"summary"`
	EncryptedContent string `json:"encrypted_content"`
}

// respPart is a content part of the Responses API.
type respPart struct {
	Type     string `json:"type"`
	Text     string `json:"text"`
	Refusal  string `json:"refusal"`
	ImageURL string `json:"image_url"`
}

// respParts reads a Responses message's content (a string or parts) into
// blocks.
func respParts(raw []byte) ([]schema.Block, error) {
	return contentBlocks(raw, func(p *respPart, e []byte) schema.Block {
		switch {
		case p.Type == "input_text" || p.Type == "output_text" || p.Type == "text":
			return schema.Block{Type: schema.BlockText, Text: p.Text}
		case p.Type == "refusal":
			return schema.Block{Type: schema.BlockText, Text: p.Refusal}
		case p.Type == "input_image" && p.ImageURL != "":
			return imageBlock(p.ImageURL)
		default:
			return rawText(e)
		}
	})
}

// respOutputText is a tool output: a string, or parts whose text is kept.
func respOutputText(raw []byte) (schema.Content, error) {
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return schema.Content{}, fmt.Errorf("%w: output: %v", errBadJSON, err)
		}
		return schema.TextContent(s), nil
	}
	b, err := respParts(raw)
	if err != nil {
		return schema.Content{}, err
	}
	return flatResult(schema.BlockContent(b...)), nil
}

// respGroup builds turns from items.
type respGroup struct {
	p      *systemPlacer
	blocks []schema.Block
	sigs   []string
	raw    []jsontext.Value
}

// flush ends the assistant run being gathered, if any.
func (g *respGroup) flush() {
	if len(g.raw) == 0 {
		return
	}
	c := schema.BlockContent(g.blocks...)
	g.p.turn(turnMsg{role: schema.RoleAssistant, content: c, canon: canonOf(schema.RoleAssistant, c, g.sigs), raw: g.raw})
	g.blocks, g.sigs, g.raw = nil, nil, nil
}

// item files one item.
func (g *respGroup) item(i int, e jsontext.Value) error {
	var it respItem
	if err := json.Unmarshal(e, &it); err != nil {
		return fmt.Errorf("%w: input[%d]: %v", errBadJSON, i, err)
	}
	if it.Type == "" && it.Role != "" {
		it.Type = "message"
	}
	switch {
	case it.Type == "message":
		blocks, err := respParts(it.Content)
		if err != nil {
			return fmt.Errorf("input[%d]: %w", i, err)
		}
		switch it.Role {
		case "system", "developer":
			g.flush()
			g.p.system(e, schema.BlockContent(blocks...).OwnText("\n"))
		case "user":
			g.flush()
			c := schema.BlockContent(blocks...)
			g.p.turn(turnMsg{role: schema.RoleUser, content: c, canon: canonOf(schema.RoleUser, c, nil), raw: []jsontext.Value{e}})
		case "assistant":
			g.blocks = append(g.blocks, blocks...)
			g.raw = append(g.raw, e)
		default:
			return fmt.Errorf("input[%d]: unknown role %q (want system, developer, user or assistant)", i, clip(it.Role, 40))
		}
	case it.Type == "reasoning":
		var texts []string
		for _, s := range it.Summary {
			texts = append(texts, s.Text)
		}
		g.blocks = append(g.blocks, schema.Block{Type: schema.BlockReasoning, Text: strings.Join(texts, "\n\n")})
		g.sigs = append(g.sigs, it.EncryptedContent)
		g.raw = append(g.raw, e)
	case strings.HasSuffix(it.Type, "_call_output"):
		g.flush()
		if it.CallID == "" {
			return fmt.Errorf("input[%d]: a %s item needs its call_id", i, it.Type)
		}
		out, err := respOutputText(it.Output)
		if err != nil {
			return fmt.Errorf("input[%d]: %w", i, err)
		}
		c := schema.BlockContent(schema.Block{Type: schema.BlockToolResult, ToolUseID: it.CallID, Content: &out})
		g.p.turn(turnMsg{role: schema.RoleUser, content: c, canon: canonOf(schema.RoleUser, c, nil), raw: []jsontext.Value{e}})
	case strings.HasSuffix(it.Type, "_call") && it.CallID != "":
		var in []byte
		switch {
		case it.Arguments != nil:
			in = toolInput(*it.Arguments)
		case len(it.Input) > 0:
			in = compactJSON(it.Input)
		case len(it.Action) > 0:
			in = compactJSON(it.Action)
		default:
			in = []byte("{}")
		}
		name := it.Name
		if name == "" {
			name = strings.TrimSuffix(it.Type, "_call")
		}
		g.blocks = append(g.blocks, schema.Block{Type: schema.BlockToolUse, ID: it.CallID, Name: name, Input: in})
		g.raw = append(g.raw, e)
	default:
		// Items the wire contract has no form for (a web search, an item
		// reference) belong to the model's side: recorded as their JSON.
		g.blocks = append(g.blocks, rawText(e))
		g.raw = append(g.raw, e)
	}
	return nil
}

func (responsesAPI) parse(o *object) (*request, error) {
	r := &request{obj: o, list: "input"}
	var top struct {
		Stream             bool            `json:"stream"`
		PromptCacheKey     string          `json:"prompt_cache_key"`
		Instructions       string          `json:"instructions"`
		PreviousResponseID string          `json:"previous_response_id"`
		Input              json.RawMessage `json:"input"`
	}
	if err := json.Unmarshal(o.raw, &top); err != nil {
		return nil, fmt.Errorf("%w: %v", errBadJSON, err)
	}
	r.stream, r.keys.PromptCacheKey, r.system = top.Stream, top.PromptCacheKey, top.Instructions
	r.stateful = top.PreviousResponseID != ""
	p := systemPlacer{req: r}
	switch {
	case len(top.Input) == 0 || string(top.Input) == "null":
		return nil, fmt.Errorf("%w: input is required", errBadJSON)
	case top.Input[0] == '"':
		var s string
		_ = json.Unmarshal(top.Input, &s)
		c := schema.BlockContent(schema.Block{Type: schema.BlockText, Text: s})
		raw := marshal(map[string]any{"role": "user", "content": json.RawMessage(top.Input)})
		p.turn(turnMsg{role: schema.RoleUser, content: c, canon: canonOf(schema.RoleUser, c, nil), raw: []jsontext.Value{raw}})
		r.listIsString = true
	default:
		elems, err := splitArray(top.Input)
		if err != nil {
			return nil, fmt.Errorf("input: %w", err)
		}
		g := respGroup{p: &p}
		for i, e := range elems {
			if err := g.item(i, e); err != nil {
				return nil, err
			}
		}
		g.flush()
	}
	p.finish()
	return r, nil
}

func (responsesAPI) render(m *schema.Message) []jsontext.Value {
	if out, ok := renderPlain(m, func(role schema.Role, s string) jsontext.Value { return respMessage(role, []string{s}) }); ok {
		return out
	}
	var out []jsontext.Value
	var text []string
	for _, b := range m.Content.Blocks {
		switch b.Type {
		case schema.BlockText:
			if b.Text != "" {
				text = append(text, b.Text)
			}
		case schema.BlockToolUse:
			args := string(b.Input)
			var s string
			if json.Unmarshal(b.Input, &s) == nil {
				args = s
			}
			if len(text) > 0 {
				out, text = append(out, respMessage(m.Role, text)), nil
			}
			out = append(out, marshal(map[string]any{"type": "function_call", "call_id": b.ID, "name": b.Name, "arguments": args}))
		case schema.BlockToolResult:
			output := ""
			if b.Content != nil {
				output = b.Content.OwnText("\n")
			}
			out = append(out, marshal(map[string]any{"type": "function_call_output", "call_id": b.ToolUseID, "output": output}))
		}
	}
	if len(text) > 0 {
		out = append(out, respMessage(m.Role, text))
	}
	return out
}

// respMessage is a message item with text parts of the role's kind.
func respMessage(role schema.Role, text []string) jsontext.Value {
	typ := "input_text"
	if role == schema.RoleAssistant {
		typ = "output_text"
	}
	parts := make([]map[string]any, len(text))
	for i, t := range text {
		parts[i] = map[string]any{"type": typ, "text": t}
	}
	return marshal(map[string]any{"type": "message", "role": role, "content": parts})
}

func (responsesAPI) reply(body []byte, sse bool) (turnMsg, *schema.Usage, bool) {
	var resp struct {
		Status string            `json:"status"`
		Output []json.RawMessage `json:"output"`
		Usage  *struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
		} `json:"usage"`
	}
	if !sse {
		if json.Unmarshal(body, &resp) != nil {
			return turnMsg{}, nil, false
		}
	} else {
		found := false
		for _, ev := range sseEvents(body) {
			var e struct {
				Type     string          `json:"type"`
				Response json.RawMessage `json:"response"`
			}
			if json.Unmarshal(ev.data, &e) == nil && e.Type == "response.completed" {
				found = json.Unmarshal(e.Response, &resp) == nil
			}
		}
		if !found {
			return turnMsg{}, nil, false
		}
	}
	if resp.Status != "" && resp.Status != "completed" || len(resp.Output) == 0 {
		return turnMsg{}, nil, false
	}
	r := &request{}
	p := systemPlacer{req: r}
	g := respGroup{p: &p}
	for i, e := range resp.Output {
		if g.item(i, jsontext.Value(e)) != nil {
			return turnMsg{}, nil, false
		}
	}
	g.flush()
	if len(r.turns) != 1 || r.turns[0].role != schema.RoleAssistant {
		return turnMsg{}, nil, false
	}
	var u *schema.Usage
	if resp.Usage != nil {
		u = usageOf(resp.Usage.InputTokens, resp.Usage.OutputTokens)
	}
	return r.turns[0], u, true
}

func (responsesAPI) errorBody(status int, msg string) []byte { return openaiError(status, msg) }
