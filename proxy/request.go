package proxy

import (
	"github.com/go-json-experiment/json/jsontext"

	"github.com/ctxpipe/ctxpipe/schema"
)

// request is a client's request as the proxy reads it: the body, where
// its message list is, and the list cut into turns and the system
// messages around them.
type request struct {
	obj *object
	// list is the member holding the message list ("messages", "input").
	list string
	// lead is the leading run of system messages; trail the system
	// messages after the last turn. Both are forwarded as they came.
	lead, trail []jsontext.Value
	turns       []turnMsg
	// system is the system prompt in force: the system messages' text, or
	// the body's own system member.
	system string
	stream bool
	keys   keyFields
	// lastUserText is the own text of the last user turn, where agents put
	// their compaction prompts.
	lastUserText string
	// listIsString: the Responses API's input given as one string.
	listIsString bool
	// stateful: the request continues a response the provider stored
	// (previous_response_id): the history is not in it.
	stateful bool
}

// fallback is what a request with no session identifies itself by.
func (r *request) fallback() []byte {
	b := []byte(r.system)
	b = append(b, 0)
	for _, t := range r.turns {
		if t.role == schema.RoleUser {
			return append(b, t.canon...)
		}
	}
	return b
}

// spliced is the message list to forward: the leading system messages,
// then each message of the effective history (the client's own bytes for
// a turn the request holds and the store says the same of, the stored
// message rendered otherwise: summaries, markers, masked stand-ins), then
// extra (turns not recorded), then the trailing system messages.
func (r *request) spliced(eff []schema.Message, ids map[string]int, render func(*schema.Message) []jsontext.Value, extra []turnMsg) []jsontext.Value {
	out := append([]jsontext.Value(nil), r.lead...)
	for i := range eff {
		m := &eff[i]
		if j, ok := ids[m.ID]; ok && !m.Synthetic() && sameContent(m, &r.turns[j]) {
			out = append(out, r.turns[j].before...)
			out = append(out, r.turns[j].raw...)
			continue
		}
		out = append(out, render(m)...)
	}
	for _, t := range extra {
		out = append(out, t.before...)
		out = append(out, t.raw...)
	}
	return append(out, r.trail...)
}
