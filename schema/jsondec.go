package schema

import (
	"errors"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	jsonv1 "github.com/go-json-experiment/json/v1"
)

// The input decoder reads a payload in one pass with encoding/json/v2's
// streaming decoder (the go-json-experiment module, which is what Go 1.27
// ships as encoding/json/v2): a content value is decoded from the same
// token stream as the turn around it, where encoding/json validated the
// whole payload first and then handed each level's bytes to an
// UnmarshalJSON that validated and decoded them again.
//
// The options keep encoding/json's acceptance rules, which are part of the
// wire contract: names match case-insensitively, a repeated name keeps its
// last value, and an escaped lone surrogate becomes U+FFFD (raw invalid
// UTF-8 is refused before, by checkEncoding).
var inputOptions = jsonv2.JoinOptions(
	jsonv2.MatchCaseInsensitiveNames(true),
	jsontext.AllowDuplicateNames(true),
	jsontext.AllowInvalidUTF8(true),
)

// decodeJSON decodes one input payload.
func decodeJSON(data []byte, v any) error {
	return jsonv2.Unmarshal(data, v, inputOptions)
}

// errContent is the error for a content value that is neither a string,
// an array nor null.
var errContent = errors.New("content: want a string or an array of blocks")

func (c *turnContent) UnmarshalJSONFrom(dec *jsontext.Decoder) error {
	return decodeContent((*Content)(c), dec, func(dec *jsontext.Decoder) (Block, error) {
		var w inputBlock
		err := jsonv2.UnmarshalDecode(dec, &w, inputOptions)
		w.Block.Content = (*Content)(w.Content)
		return w.Block, err
	})
}

func (c *innerContent) UnmarshalJSONFrom(dec *jsontext.Decoder) error {
	return decodeContent((*Content)(c), dec, func(dec *jsontext.Decoder) (Block, error) {
		var w innerBlock
		err := jsonv2.UnmarshalDecode(dec, &w, inputOptions)
		return w.Block, err // w.Content is nil: noContent refuses any other value
	})
}

// UnmarshalJSONFrom refuses every value but null, which never reaches it
// (a null pointer field is set to nil). It does not read the value: what is
// below is never decoded.
func (*noContent) UnmarshalJSONFrom(*jsontext.Decoder) error {
	return Errorf(ReasonBadBlock, "a block inside a tool_result cannot carry content of its own")
}

// decodeContent reads either form of content from dec, each block with
// block, which knows the level it decodes.
func decodeContent(c *Content, dec *jsontext.Decoder, block func(*jsontext.Decoder) (Block, error)) error {
	switch dec.PeekKind() {
	case '"':
		tok, err := dec.ReadToken()
		if err != nil {
			return err
		}
		*c = Content{Text: tok.String()}
		return nil
	case 'n':
		// null is treated as the empty string: some clients send it for
		// assistant turns that only called tools.
		_, err := dec.ReadToken()
		*c = Content{}
		return err
	case '[':
		if _, err := dec.ReadToken(); err != nil {
			return err
		}
		blocks := []Block{}
		for dec.PeekKind() != ']' {
			if dec.PeekKind() == 0 {
				_, err := dec.ReadToken() // reports the syntax error
				return err
			}
			b, err := block(dec)
			if err != nil {
				return err
			}
			blocks = append(blocks, b)
		}
		if _, err := dec.ReadToken(); err != nil {
			return err
		}
		*c = Content{Blocks: blocks, IsBlocks: true}
		return nil
	case 0:
		_, err := dec.ReadToken()
		return err
	}
	if err := dec.SkipValue(); err != nil {
		return err
	}
	return errContent
}

// marshalOptions make encoding/json/v2 write what encoding/json wrote (its
// legacy omitempty, method and error rules) without HTML escaping, and
// without escaping U+2028 and U+2029 for JavaScript source either: written
// as \u2028, each of those 3-byte characters would take 6, so an accepted
// 4 MiB turn of them would become a message over the 8 MiB reply limit.
// Nothing an input says then grows when it is written out again: what JSON
// must escape, the input had to escape too.
var marshalOptions = jsonv2.JoinOptions(jsonv1.DefaultOptionsV1(), jsontext.EscapeForHTML(false), jsontext.EscapeForJS(false))

// MarshalJSONTo writes the form the content arrived in, into the stream
// being encoded: encoding/json validated and compacted again whatever a
// MarshalJSON method returned.
func (c Content) MarshalJSONTo(enc *jsontext.Encoder) error {
	if c.IsBlocks {
		if c.Blocks == nil {
			if err := enc.WriteToken(jsontext.BeginArray); err != nil {
				return err
			}
			return enc.WriteToken(jsontext.EndArray)
		}
		return jsonv2.MarshalEncode(enc, c.Blocks)
	}
	return enc.WriteToken(jsontext.String(c.Text))
}

// UnmarshalStored decodes JSON the service wrote itself (a stored message
// body, a stored state): encoding/json/v2's decoder with its defaults,
// about twice as fast as encoding/json on a large body. The input
// decoder's lenient options are not needed: these bytes came from Marshal.
func UnmarshalStored(data []byte, v any) error { return jsonv2.Unmarshal(data, v) }
