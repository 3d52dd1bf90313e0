package schema

import (
	"bytes"
	"unicode/utf8"
)

// Limits on an input's numbers and shape. Each one closes a way for a single
// hostile input to make ctxpipe store something that breaks its readers or
// to hold a lane: they are part of the wire contract (turn.schema.json states
// the same bounds).
const (
	// MaxTokenCount bounds every token count ctxpipe accepts: each usage
	// field, their sum, and a profile's context_window. No model's window is
	// near it, and sums of counts below it cannot overflow an int.
	MaxTokenCount = 100_000_000

	// MaxToolInputDepth bounds how deeply a tool_use input nests: {"a":1}
	// is depth 1, {"a":[1]} depth 2. Real tool inputs nest a few levels;
	// a deeper one would be stored and then break every history reply for
	// readers with a recursion limit (Python's json module, for one).
	MaxToolInputDepth = 64

	// MaxPayloadDepth bounds how deeply any JSON value in an input nests,
	// counting the payload's own object as level 1. It leaves room for a
	// tool input at MaxToolInputDepth inside its turn, content array and
	// block. It is checked on the raw bytes before anything is decoded, so
	// decoding a payload costs time linear in its size, never time
	// proportional to depth times size, as a tool_result nested in
	// tool_result thousands of levels deep would.
	MaxPayloadDepth = MaxToolInputDepth + 8
)

// checkEncoding rejects a payload that is not valid UTF-8 or that nests
// deeper than maxDepth, with ReasonBadEncoding. encoding/json would replace
// invalid bytes in strings with U+FFFD but keeps them in a tool input's raw
// bytes, and nothing else bounds nesting below its own 10,000 levels.
//
// Only the nesting of well-formed JSON matters here: a payload that is not
// JSON is rejected by the decoder that runs next.
func checkEncoding(data []byte, maxDepth int) error {
	if !utf8.Valid(data) {
		return Errorf(ReasonBadEncoding, "payload is not valid UTF-8")
	}
	if d := jsonDepth(data, maxDepth); d > maxDepth {
		return Errorf(ReasonBadEncoding, "payload nests deeper than %d levels", maxDepth)
	}
	return nil
}

// jsonDepth returns how deeply data nests (arrays and objects opened outside
// strings), stopping as soon as it passes limit. It is one linear pass:
// strings are skipped with bytes.IndexByte, and each backslash before a
// quote is looked at once.
func jsonDepth(data []byte, limit int) int {
	depth, deepest := 0, 0
	for i := 0; i < len(data); i++ {
		switch data[i] {
		case '"':
			end := stringEnd(data, i)
			if end < 0 {
				return deepest // unterminated: not JSON, the decoder says so
			}
			i = end
		case '[', '{':
			depth++
			if depth > deepest {
				deepest = depth
				if deepest > limit {
					return deepest
				}
			}
		case ']', '}':
			depth--
		}
	}
	return deepest
}

// stringEnd returns the index of the quote that closes the string opened at
// data[start], or -1 when there is none.
func stringEnd(data []byte, start int) int {
	j := start + 1
	for {
		k := bytes.IndexByte(data[j:], '"')
		if k < 0 {
			return -1
		}
		j += k
		// The quote is escaped when an odd number of backslashes precede it.
		n := 0
		for p := j - 1; p > start && data[p] == '\\'; p-- {
			n++
		}
		if n%2 == 0 {
			return j
		}
		j++
	}
}
