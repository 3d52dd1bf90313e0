package proxy

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/ctxpipe/ctxpipe/schema"
)

// turnMsg is one turn of a request: what the proxy publishes, what it
// compares, and the client's own bytes it forwards.
type turnMsg struct {
	role    schema.Role
	content schema.Content
	// canon is what the model reads of the turn, in one canonical form:
	// the basis of its id. Two requests that differ only in how a client
	// wrote the same turn (a cache_control breakpoint moved, a string that
	// became one text block, fields an SDK adds) have the same canon.
	canon []byte
	// raw is the client's elements of the message list that make the turn
	// (one message; in the Responses API a run of output items).
	raw []jsontext.Value
	// before is the system messages the client put right before the turn,
	// forwarded with it.
	before []jsontext.Value
}

// canonBlock is the canonical form of a content block: only what the
// model reads, in a fixed field order.
type canonBlock struct {
	Type      string          `json:"t"`
	Text      string          `json:"x,omitempty"`
	ID        string          `json:"i,omitempty"`
	Name      string          `json:"n,omitempty"`
	Input     json.RawMessage `json:"a,omitempty"`
	ToolUseID string          `json:"u,omitempty"`
	IsError   bool            `json:"e,omitempty"`
	Source    string          `json:"s,omitempty"`
	Content   []canonBlock    `json:"c,omitempty"`
	// Sig is an opaque part the provider checks (a thinking block's
	// signature, redacted thinking's data, encrypted reasoning).
	Sig string `json:"g,omitempty"`
}

// canonOf is the canonical form of a turn's role and content; sigs are the
// opaque parts of its reasoning, in order, which belong to what the model
// reads although the wire contract's reasoning block has no field for them.
func canonOf(role schema.Role, c schema.Content, sigs []string) []byte {
	blocks := canonBlocks(c)
	for i, s := range sigs {
		blocks = append(blocks, canonBlock{Type: "sig", Sig: s, Text: fmt.Sprint(i)})
	}
	b, err := schema.Marshal(struct {
		Role   schema.Role  `json:"r"`
		Blocks []canonBlock `json:"b"`
	}{role, blocks})
	if err != nil {
		// Only strings and valid JSON go in: Marshal cannot fail on them.
		panic(fmt.Sprintf("proxy: canonical form: %v", err))
	}
	return b
}

// canonBlocks normalizes content: a string is one text block, empty text
// is nothing, tool inputs lose insignificant white space.
func canonBlocks(c schema.Content) []canonBlock {
	var out []canonBlock
	for _, b := range c.BlocksOf() {
		cb := canonBlock{Type: string(b.Type)}
		switch b.Type {
		case schema.BlockText:
			if b.Text == "" {
				continue
			}
			cb.Text = b.Text
		case schema.BlockReasoning:
			cb.Text = b.Text
		case schema.BlockToolUse:
			cb.ID, cb.Name, cb.Input = b.ID, b.Name, compactJSON(b.Input)
		case schema.BlockToolResult:
			cb.ToolUseID, cb.IsError = b.ToolUseID, b.IsError
			if b.Content != nil {
				cb.Content = canonBlocks(*b.Content)
			}
		case schema.BlockImage:
			if b.Source != nil {
				cb.Source = b.Source.Type + ":" + b.Source.MediaType + ":" + b.Source.Data + b.Source.URL
			}
		}
		out = append(out, cb)
	}
	return out
}

// compactJSON removes insignificant white space; what is not JSON stays
// as it is (a tool's arguments cut off mid-stream, say).
func compactJSON(b []byte) json.RawMessage {
	if len(b) == 0 {
		return nil
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return b
	}
	return buf.Bytes()
}

// toolInput is a tool call's arguments as a tool_use block's input: the
// JSON they hold, compact, or, when they are not JSON, the string itself.
func toolInput(args string) json.RawMessage {
	if json.Valid([]byte(args)) && args != "" {
		return compactJSON([]byte(args))
	}
	b, _ := schema.Marshal(args)
	return b
}

// turnID derives a turn's input id from its conversation, its position in
// the conversation's agent turns and its canonical form, keyed with the
// proxy's secret: the same turn of the same request gets the same id every
// time (a retry publishes nothing twice), and no one without the secret can
// predict it (the wire contract's ids are shared by all tenants).
func turnID(secret []byte, conv string, pos int, canon []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(conv))
	m.Write([]byte{0})
	var p [8]byte
	binary.BigEndian.PutUint64(p[:], uint64(pos))
	m.Write(p[:])
	m.Write(canon)
	s := m.Sum(nil)
	s[6] = s[6]&0x0f | 0x80 // version 8: a custom UUID
	s[8] = s[8]&0x3f | 0x80 // RFC 9562 variant
	return fmt.Sprintf("%x-%x-%x-%x-%x", s[0:4], s[4:6], s[6:8], s[8:10], s[10:16])
}

// sameContent reports whether a stored message says what the request's
// turn says: then the client's own bytes stand for it upstream.
func sameContent(m *schema.Message, t *turnMsg) bool {
	if m.Role != t.role {
		return false
	}
	a, _ := schema.Marshal(canonBlocks(m.Content))
	b, _ := schema.Marshal(canonBlocks(t.content))
	return bytes.Equal(a, b)
}
