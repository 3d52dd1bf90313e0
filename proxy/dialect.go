package proxy

import (
	"encoding/json"
	"net/http"
	"strings"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/ctxpipe/ctxpipe/schema"
)

// dialect is one provider API's wire format: how its requests hold their
// messages, how a stored message is written in it, how its replies are
// read back into a turn, and how its errors look.
type dialect interface {
	// parse reads the request's message list into turns; a message the
	// API does not know (an unknown role) is an error for a 400.
	parse(o *object) (*request, error)
	// render writes a stored message (a summary, a marker) in the API's
	// message format: zero or more elements of the message list.
	render(m *schema.Message) []jsontext.Value
	// reply reads a complete reply body (JSON or SSE) into the assistant
	// turn and the provider's usage; ok is false when it holds none.
	reply(body []byte, sse bool) (t turnMsg, u *schema.Usage, ok bool)
	// errorBody is an error in the API's own format.
	errorBody(status int, msg string) []byte
}

// overflowMarkers are what providers say when a request exceeds the
// model's context window (OpenAI's code, Anthropic's message, and the
// wordings of the compatible servers).
var overflowMarkers = []string{
	"context_length_exceeded", "prompt is too long", "maximum context length",
	"context window", "context length", "too many tokens", "exceeds the context",
	"input is too long", "request_too_large",
}

// isOverflow reports whether an upstream error says the context window was
// exceeded.
func isOverflow(status int, body []byte) bool {
	if status != http.StatusBadRequest && status != http.StatusRequestEntityTooLarge {
		return false
	}
	s := strings.ToLower(string(body))
	for _, m := range overflowMarkers {
		if strings.Contains(s, m) {
			return true
		}
	}
	return false
}

// rawText turns an element the wire contract has no block for (a document,
// an audio part, a server tool's result) into a text block holding its
// JSON, so that it is recorded, counted and compared like text.
func rawText(v []byte) schema.Block {
	return schema.Block{Type: schema.BlockText, Text: string(compactJSON(v))}
}

// marshal writes v as JSON without HTML escaping.
func marshal(v any) jsontext.Value {
	b, err := schema.Marshal(v)
	if err != nil {
		panic("proxy: marshal: " + err.Error())
	}
	return b
}

// jsonString is s as a JSON string.
func jsonString(s string) json.RawMessage { return json.RawMessage(marshal(s)) }

// joinText joins the non-empty parts with a blank line.
func joinText(parts ...string) string {
	var out []string
	for _, p := range parts {
		if p != "" {
			out = append(out, p)
		}
	}
	return strings.Join(out, "\n\n")
}

// systemPlacer files a request's system messages: into the leading run
// while no turn came yet, else before the next turn (pending), or the
// trail at the end; finish completes the request from what was filed
// (its trail, its system text, its last user text and its fallback key).
type systemPlacer struct {
	req     *request
	pending []jsontext.Value
	texts   []string
}

func (p *systemPlacer) system(raw jsontext.Value, text string) {
	if len(p.req.turns) == 0 {
		p.req.lead = append(p.req.lead, raw)
	} else {
		p.pending = append(p.pending, raw)
	}
	p.texts = append(p.texts, text)
}

func (p *systemPlacer) turn(t turnMsg) {
	t.before, p.pending = p.pending, nil
	p.req.turns = append(p.req.turns, t)
}

func (p *systemPlacer) finish() {
	p.req.trail = p.pending
	p.req.system = joinText(append([]string{p.req.system}, p.texts...)...)
	if n := len(p.req.turns); n > 0 && p.req.turns[n-1].role == schema.RoleUser {
		p.req.lastUserText = p.req.turns[n-1].content.OwnText("\n")
	}
	p.req.keys.Fallback = p.req.fallback()
}

// renderPlain writes a message whose content is one string as text writes
// it in one API, and nothing for an empty string; ok is false for content
// in blocks, which each API writes its own way.
func renderPlain(m *schema.Message, text func(role schema.Role, s string) jsontext.Value) (out []jsontext.Value, ok bool) {
	if m.Content.IsBlocks {
		return nil, false
	}
	if m.Content.Text == "" {
		return nil, true
	}
	return []jsontext.Value{text(m.Role, m.Content.Text)}, true
}

// roleContent is a message of text as the Chat Completions and Messages
// APIs write it: {"role", "content": string}.
func roleContent(role schema.Role, s string) jsontext.Value {
	return marshal(map[string]any{"role": role, "content": s})
}
