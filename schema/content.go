package schema

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	jsonv2 "github.com/go-json-experiment/json"
)

// BlockType names the kind of a content block, as in the Anthropic wire format.
type BlockType string

// The block types a Turn may carry.
const (
	BlockText       BlockType = "text"
	BlockImage      BlockType = "image"
	BlockToolUse    BlockType = "tool_use"
	BlockToolResult BlockType = "tool_result"
	BlockReasoning  BlockType = "reasoning"
)

// ImageSource is an image block's payload. Only base64 data is counted by size;
// a URL source is counted as a fixed estimate.
type ImageSource struct {
	Type      string `json:"type"`
	MediaType string `json:"media_type,omitempty"`
	Data      string `json:"data,omitempty"`
	URL       string `json:"url,omitempty"`
}

// Block is one content block. It is a flat tagged struct, mapping one to one to
// the JSON, because ctxpipe's job is wire fidelity: it round-trips, fuzzes and is
// counted without a type switch per shape.
type Block struct {
	Type   BlockType    `json:"type"`
	Text   string       `json:"text,omitempty"`
	Source *ImageSource `json:"source,omitempty"`
	// tool_use
	ID   string `json:"id,omitempty"`
	Name string `json:"name,omitempty"`
	// Input keeps the tool input's own bytes (key order and characters as sent).
	// Token counts are taken from these bytes: re-encoding through a Go map
	// would sort keys and escape <>&, which changes the count.
	Input json.RawMessage `json:"input,omitempty"`
	// tool_result
	ToolUseID string   `json:"tool_use_id,omitempty"`
	Content   *Content `json:"content,omitempty"`
	IsError   bool     `json:"is_error,omitempty"`
}

// Content is a turn's content: a plain string or an array of blocks. It
// remembers which form it arrived in and encodes back to that form.
type Content struct {
	Text   string
	Blocks []Block
	// IsBlocks reports the array form; the zero Content is the empty string.
	IsBlocks bool
}

// TextContent returns string-form content.
func TextContent(s string) Content { return Content{Text: s} }

// BlockContent returns array-form content.
func BlockContent(b ...Block) Content { return Content{Blocks: b, IsBlocks: true} }

// UnmarshalJSON accepts a JSON string or an array of blocks.
func (c *Content) UnmarshalJSON(b []byte) error {
	return unmarshalContent(c, b, func(b []byte) ([]Block, error) {
		var blocks []Block
		err := json.Unmarshal(b, &blocks)
		return blocks, err
	})
}

// unmarshalContent decodes either form of content; blocks decodes the array
// form, so that inputs can use a stricter block decoder than stored messages.
func unmarshalContent(c *Content, b []byte, blocks func([]byte) ([]Block, error)) error {
	b = bytes.TrimLeft(b, " \t\r\n")
	if len(b) == 0 {
		return fmt.Errorf("content: empty")
	}
	switch b[0] {
	case '"':
		*c = Content{}
		// The decoder has validated b already: a string without escapes
		// (most tool output) needs no second pass through encoding/json.
		if inner := b[1 : len(b)-1]; bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
			c.Text = string(inner)
			return nil
		}
		return json.Unmarshal(b, &c.Text)
	case '[':
		bl, err := blocks(b)
		if err != nil {
			return err
		}
		*c = Content{Blocks: bl, IsBlocks: true}
		if c.Blocks == nil {
			c.Blocks = []Block{}
		}
		return nil
	case 'n':
		// null is treated as the empty string: some clients send it for
		// assistant turns that only called tools.
		*c = Content{}
		return nil
	}
	return fmt.Errorf("content: want a string or an array of blocks")
}

// The input decoder's content types. A turn's content holds blocks,
// and a tool_result's content holds blocks that carry no content of their
// own, so an input is decoded with types that know their level and refuse a
// third level as soon as they meet it, before reading it: decoding stays
// linear in the payload's size. Each wire type embeds Block and shadows only
// its content field, so fields added to Block are decoded as before.
type (
	// turnContent is a turn's content.
	turnContent Content
	// inputBlock is a block of a turn's content.
	inputBlock struct {
		Block
		Content *innerContent `json:"content,omitempty"`
	}
	// innerContent is the content of a block of a turn (a tool_result's).
	innerContent Content
	// innerBlock is a block inside a tool_result: text or image.
	innerBlock struct {
		Block
		Content *noContent `json:"content,omitempty"`
	}
	// noContent is the content of a block inside a tool_result: there is none.
	noContent struct{}
)

// Their UnmarshalJSONFrom methods are in jsondec.go.

// MarshalJSON writes the form the content arrived in.
func (c Content) MarshalJSON() ([]byte, error) {
	if c.IsBlocks {
		if c.Blocks == nil {
			return []byte("[]"), nil
		}
		return marshalNoEscape(c.Blocks)
	}
	return marshalNoEscape(c.Text)
}

// OwnText is what a message says in its own words: a string content, or
// its text blocks joined by sep, without tool uses, tool results, images or
// reasoning. It is "" for a user turn that only returns tool results.
func (c Content) OwnText(sep string) string {
	if !c.IsBlocks {
		return c.Text
	}
	var parts []string
	for _, b := range c.Blocks {
		if b.Type == BlockText && strings.TrimSpace(b.Text) != "" {
			parts = append(parts, b.Text)
		}
	}
	return strings.Join(parts, sep)
}

// BlocksOf returns the content as blocks: a string becomes one text block
// (none when empty), as Roo's counting and condensing code treat it.
func (c Content) BlocksOf() []Block {
	if c.IsBlocks {
		return c.Blocks
	}
	if c.Text == "" {
		return nil
	}
	return []Block{{Type: BlockText, Text: c.Text}}
}

// HasBlock reports whether the content holds a block of type t.
func (c Content) HasBlock(t BlockType) bool {
	for _, b := range c.Blocks {
		if b.Type == t {
			return true
		}
	}
	return false
}

// Marshal encodes v as JSON without HTML escaping, so that text and tool
// inputs keep their characters (<, >, & are common in code) byte for byte.
func Marshal(v any) ([]byte, error) { return jsonv2.Marshal(v, marshalOptions) }

func marshalNoEscape(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	out := buf.Bytes()
	return out[:len(out)-1], nil // Encode appends a newline
}
