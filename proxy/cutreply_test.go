package proxy

import (
	"bytes"
	"net/http/httptest"
	"testing"
)

// A reply is recorded only from a body the dialect's parser takes (the
// proxy hands it on even when the upstream's read failed): a stream is
// taken only with its final event, and JSON only whole. Cut anywhere
// before, neither is taken.
func TestRepliesCutBeforeTheirEndAreRefused(t *testing.T) {
	a := answer{n: 1, in: 10, out: 5, text: "Let me look.", calls: []call{{"call_1_a", "bash", `{"command":"ls"}`}}}
	for _, c := range []struct {
		name  string
		d     dialect
		write func(*httptest.ResponseRecorder, bool)
		final string // where a stream's final event starts
	}{
		{"chat", chatAPI{}, func(w *httptest.ResponseRecorder, s bool) { a.chat(w, s) }, "data: [DONE]"},
		{"messages", messagesAPI{}, func(w *httptest.ResponseRecorder, s bool) { a.messages(w, s) }, "event: message_stop"},
		{"responses", responsesAPI{}, func(w *httptest.ResponseRecorder, s bool) { a.responses(w, s) }, "event: response.completed"},
	} {
		for _, sse := range []bool{true, false} {
			w := httptest.NewRecorder()
			c.write(w, sse)
			body := w.Body.Bytes()
			if _, _, ok := c.d.reply(body, sse); !ok {
				t.Fatalf("%s (stream %v): the whole reply is refused", c.name, sse)
			}
			end := len(body) / 2
			if sse {
				if end = bytes.LastIndex(body, []byte(c.final)); end < 0 {
					t.Fatalf("%s: no %q in the stream", c.name, c.final)
				}
			}
			for _, cut := range []int{end, end + len(c.final)/2, len(body) - 1} {
				if !sse && cut == len(body)-1 && bytes.HasSuffix(bytes.TrimSpace(body[:cut]), []byte("}")) {
					continue // JSON whose last byte is a newline is whole without it
				}
				if _, _, ok := c.d.reply(body[:cut], sse); ok {
					t.Errorf("%s (stream %v): a body cut at %d of %d is taken", c.name, sse, cut, len(body))
				}
			}
		}
	}
}
