package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestJSONDepth(t *testing.T) {
	tests := []struct {
		in   string
		want int
	}{
		{`1`, 0},
		{`"x"`, 0},
		{`{}`, 1},
		{`[]`, 1},
		{`[[],{}]`, 2},
		{`{"a":[{"b":[]}]}`, 4},
		{`"[[[{{{"`, 0},
		{`["]]]", [1]]`, 2},
		{`["\"[[", [1]]`, 2},          // an escaped quote does not end the string
		{`["\\", [1]]`, 2},            // an escaped backslash before the closing quote
		{`["\\\"[", [1]]`, 2},         // three backslashes: the quote is escaped
		{`["\\\\", [[1]]]`, 3},        // four: it is not
		{`{"\\":{"\"":{"x":[]}}}`, 4}, // the same rules in keys
		{"[\"\u00e9[\", [\"\U0001F600\"]]", 2},
		{`"unterminated [[[`, 0},
		{strings.Repeat("[", 100) + strings.Repeat("]", 100), 100},
	}
	for _, tt := range tests {
		if got := jsonDepth([]byte(tt.in), 1000); got != tt.want {
			t.Errorf("jsonDepth(%s) = %d, want %d", tt.in, got, tt.want)
		}
	}
	// It stops as soon as the limit is passed, without reading the rest.
	if got := jsonDepth([]byte(strings.Repeat("[", 10_000)), 5); got != 6 {
		t.Errorf("jsonDepth past the limit = %d, want 6", got)
	}
}

// refDepth is the depth encoding/json's tokenizer sees in valid JSON.
func refDepth(data []byte) (int, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	depth, deepest := 0, 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return deepest, nil
		}
		if err != nil {
			return 0, err
		}
		switch tok {
		case json.Delim('['), json.Delim('{'):
			depth++
			deepest = max(deepest, depth)
		case json.Delim(']'), json.Delim('}'):
			depth--
		}
	}
}

// FuzzJSONDepth holds the byte scan to encoding/json's tokenizer on every
// valid JSON text: the depth limit must be exactly what the decoder meets.
func FuzzJSONDepth(f *testing.F) {
	for _, s := range []string{`1`, `[]`, `{"a":[1,{"b":"]"}]}`, `["\\"]`, `["\\\"]"]`, `{"\u005b":"\"{"}`,
		`[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]`,
		" [ \"a\\\\\" , { } ] "} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if !json.Valid(data) {
			return
		}
		want, err := refDepth(data)
		if err != nil {
			t.Fatalf("tokenizer on valid JSON: %v", err)
		}
		if got := jsonDepth(data, 1<<30); got != want {
			t.Fatalf("jsonDepth(%q) = %d, tokenizer says %d", data, got, want)
		}
	})
}

func TestCheckEncoding(t *testing.T) {
	tests := []struct {
		in string
		ok bool
	}{
		{`{"a":"é"}`, true},
		{`{"a":"\ud800"}`, true}, // an escape, not bytes: valid JSON text
		{"{\"a\":\"\xff\"}", false},
		{"{\"a\":\"\xed\xa0\x80\"}", false}, // a surrogate's bytes are not UTF-8
		{"{\"a\":\"\xc0\x80\"}", false},     // overlong NUL
		{"{\"a\":\"\xf4\x90\x80\x80\"}", false},
		{`{"a":` + strings.Repeat("[", MaxPayloadDepth-1) + strings.Repeat("]", MaxPayloadDepth-1) + `}`, true},
		{`{"a":` + strings.Repeat("[", MaxPayloadDepth) + strings.Repeat("]", MaxPayloadDepth) + `}`, false},
	}
	for _, tt := range tests {
		err := checkEncoding([]byte(tt.in), MaxPayloadDepth)
		if (err == nil) != tt.ok || (err != nil && ReasonOf(err) != ReasonBadEncoding) {
			t.Errorf("checkEncoding(%q) = %v, want ok=%v", tt.in, err, tt.ok)
		}
	}
}
