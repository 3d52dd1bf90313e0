package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
)

// object is a request body as the client sent it: a JSON object whose
// top-level members are known by their byte ranges, so that the proxy can
// replace one member's value and leave every other byte as it came.
type object struct {
	raw     []byte
	members []member
}

// member is one top-level name and the byte range of its value in raw.
type member struct {
	name       string
	start, end int
}

// errBadJSON is a body the proxy cannot read: the caller gets a 400.
var errBadJSON = errors.New("malformed JSON")

// parseObject reads body as one JSON object. Invalid UTF-8 and anything but
// an object are refused; of a repeated name the last counts, as the
// providers' own decoders do.
func parseObject(body []byte) (*object, error) {
	if !utf8.Valid(body) {
		return nil, fmt.Errorf("%w: the body is not valid UTF-8", errBadJSON)
	}
	d, err := openJSON(body, '{', "the body must be a JSON object")
	if err != nil {
		return nil, err
	}
	o := &object{raw: body}
	for d.PeekKind() != '}' {
		tok, err := d.ReadToken()
		if err != nil {
			return nil, fmt.Errorf("%w: %v", errBadJSON, err)
		}
		name := tok.String() // a token is valid only until the next read
		v, err := d.ReadValue()
		if err != nil {
			return nil, fmt.Errorf("%w: %v", errBadJSON, err)
		}
		end := int(d.InputOffset())
		o.members = append(o.members, member{name: name, start: end - len(v), end: end})
	}
	if _, err := d.ReadToken(); err != nil {
		return nil, fmt.Errorf("%w: %v", errBadJSON, err)
	}
	if _, err := d.ReadToken(); err == nil {
		return nil, fmt.Errorf("%w: data after the object", errBadJSON)
	}
	return o, nil
}

// openJSON starts decoding raw, whose first token must open an object
// ('{') or an array ('['): else the error says what it must be.
func openJSON(raw []byte, open jsontext.Kind, must string) (*jsontext.Decoder, error) {
	d := jsontext.NewDecoder(bytes.NewReader(raw), jsontext.AllowDuplicateNames(true))
	tok, err := d.ReadToken()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errBadJSON, err)
	}
	if tok.Kind() != open {
		return nil, fmt.Errorf("%w: %s", errBadJSON, must)
	}
	return d, nil
}

// get returns the raw value of the last member called name, or nil.
func (o *object) get(name string) []byte {
	for i := len(o.members) - 1; i >= 0; i-- {
		if m := o.members[i]; m.name == name {
			return o.raw[m.start:m.end]
		}
	}
	return nil
}

// with returns the body with the value of every member called name
// replaced by v; all other bytes stay as they were.
func (o *object) with(name string, v []byte) []byte {
	out := make([]byte, 0, len(o.raw)+len(v))
	at := 0
	for _, m := range o.members {
		if m.name != name {
			continue
		}
		out = append(out, o.raw[at:m.start]...)
		out = append(out, v...)
		at = m.end
	}
	return append(out, o.raw[at:]...)
}

// joinArray writes elements as a JSON array, each element's bytes as given.
func joinArray(elems []jsontext.Value) []byte {
	n := 2
	for _, e := range elems {
		n += len(e) + 1
	}
	out := make([]byte, 0, n)
	out = append(out, '[')
	for i, e := range elems {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, e...)
	}
	return append(out, ']')
}

// messages is the request's "messages" array (Chat Completions and
// Messages), split into its elements; it is required.
func (o *object) messages() ([]jsontext.Value, error) {
	raw := o.get("messages")
	if raw == nil {
		return nil, fmt.Errorf("%w: messages is required", errBadJSON)
	}
	elems, err := splitArray(raw)
	if err != nil {
		return nil, fmt.Errorf("messages: %w", err)
	}
	return elems, nil
}

// splitArray returns the elements of a JSON array, each as its own bytes.
func splitArray(raw []byte) ([]jsontext.Value, error) {
	d, err := openJSON(raw, '[', "want an array")
	if err != nil {
		return nil, err
	}
	var out []jsontext.Value
	for d.PeekKind() != ']' {
		v, err := d.ReadValue()
		if err != nil {
			return nil, fmt.Errorf("%w: %v", errBadJSON, err)
		}
		out = append(out, v.Clone())
	}
	return out, nil
}
