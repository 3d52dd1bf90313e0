package proxy

import (
	"bytes"
	"strings"
)

// sseEvent is one server-sent event: its event name and its data lines
// joined by newlines.
type sseEvent struct {
	name string
	data []byte
}

// sseEvents splits an SSE body into its events (comments and the other
// fields are skipped); an event cut off at the end of the body is left out.
func sseEvents(body []byte) []sseEvent {
	var out []sseEvent
	var cur sseEvent
	var has bool
	for len(body) > 0 {
		i := bytes.IndexByte(body, '\n')
		if i < 0 {
			break // an unfinished line: the stream ended early
		}
		line := bytes.TrimSuffix(body[:i], []byte("\r"))
		body = body[i+1:]
		if len(line) == 0 {
			if has {
				out = append(out, cur)
			}
			cur, has = sseEvent{}, false
			continue
		}
		field, value, _ := strings.Cut(string(line), ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "event":
			cur.name, has = value, true
		case "data":
			if cur.data != nil {
				cur.data = append(cur.data, '\n')
			}
			cur.data = append(cur.data, value...)
			if cur.data == nil {
				cur.data = []byte{}
			}
			has = true
		}
	}
	return out
}
