package store

import (
	"errors"
	"fmt"

	"github.com/ctxpipe/ctxpipe/schema"
)

// EncodedChanges is the JSON Commit stores for an entry's Changes: the body
// of each inserted message (in Changes.Insert's order, without its parent
// tags, which live in their own columns), the state (nil when the entry
// leaves it alone, as when Changes.State.ConversationID is empty), and each
// event (in Changes.Events' order).
type EncodedChanges struct {
	Bodies [][]byte
	State  []byte
	Events [][]byte
	// complete is set by EncodeChanges, whose Changes hold whole messages
	// (a live commit whose worker encoded them ahead): those are cached as
	// an unencoded commit's are. A decoded changelog record's are not.
	complete bool
}

// EncodeChanges returns the JSON Commit stores for e.Changes (nil when it
// has none), checking e as Commit does. It is what a changelog record
// carries: replaying the entry with it writes the same bytes. A worker sets
// it as e.Encoded ahead of the commit, so that the single writer encodes
// nothing (neither for SQLite nor for the record).
func EncodeChanges(e Entry) (*EncodedChanges, error) {
	x, err := encodeEntry(e)
	if err != nil || e.Changes == nil {
		return nil, err
	}
	enc := &EncodedChanges{State: x.state, complete: !x.replayed}
	if len(x.msgs) > 0 {
		enc.Bodies = make([][]byte, len(x.msgs))
		for i, em := range x.msgs {
			enc.Bodies[i] = em.body
		}
	}
	if len(x.events) > 0 {
		enc.Events = make([][]byte, len(x.events))
		for i, ev := range x.events {
			enc.Events[i] = ev.body
		}
	}
	return enc, nil
}

// encoded is an Entry with every JSON body made before the transaction
// starts, so the write lock is held only for SQL.
type encoded struct {
	in      InputRecord
	hash    [32]byte // of the whole payload
	size    int      // of the whole payload
	payload []byte   // what the row keeps of it
	ch      *schema.Changes
	conv    string
	// replayed: the bodies came encoded from a changelog record
	// (Entry.Encoded); the messages hold only their column fields and are
	// not cached.
	replayed bool
	msgs     []encodedMessage
	events   []encodedEvent
	state    []byte // nil: leave the conversation's state alone
	deletes  []string
}

type encodedMessage struct {
	m      schema.Message
	before string
	body   []byte
}

type encodedEvent struct {
	h       *schema.EventHeader
	ref     string
	subject string
	body    []byte
}

func encodeEntry(e Entry) (encoded, error) {
	in := e.Input
	x := encoded{in: in, ch: e.Changes, conv: in.ConversationID}
	if in.Stored != nil {
		x.hash, x.size, x.payload = in.Stored.Hash, in.Stored.Size, in.Payload
	} else {
		x.hash, x.size, x.payload = PayloadHash(in.Payload), len(in.Payload), storedPayload(in.Status, in.Payload)
	}
	if payloadInMessage(in, e.Changes) {
		// A record written before turns were stored once carries the
		// payload too: the row is the same whatever the record held.
		x.payload = nil
	}
	if in.ID == "" {
		return x, errors.New("input id is empty")
	}
	switch in.Status {
	case StatusApplied, StatusRejected:
	default:
		return x, fmt.Errorf("input status %q is neither %q nor %q", in.Status, StatusApplied, StatusRejected)
	}
	ch := e.Changes
	if ch == nil {
		return x, nil
	}
	if x.conv == "" && (len(ch.Insert) > 0 || len(ch.Tags) > 0 || len(ch.Delete) > 0 || ch.State.ConversationID != "") {
		return x, errors.New("changes to messages or state need the input's conversation id")
	}
	enc := e.Encoded
	if enc != nil {
		if len(enc.Bodies) != len(ch.Insert) || len(enc.Events) != len(ch.Events) || (enc.State != nil) != (ch.State.ConversationID != "") {
			return x, fmt.Errorf("encoded changes (%d bodies, %d events, state %v) do not match the changes (%d messages, %d events, state %v)",
				len(enc.Bodies), len(enc.Events), enc.State != nil, len(ch.Insert), len(ch.Events), ch.State.ConversationID != "")
		}
		x.replayed = !enc.complete
	}
	if len(ch.Insert) > 0 {
		x.msgs = make([]encodedMessage, 0, len(ch.Insert))
	}
	for i, ins := range ch.Insert {
		m := ins.Message
		if m.ID == "" {
			return x, errors.New("inserted message has no id")
		}
		if m.ConversationID == "" {
			m.ConversationID = x.conv
		} else if m.ConversationID != x.conv {
			return x, fmt.Errorf("message %s names conversation %q, input is for %q", m.ID, m.ConversationID, x.conv)
		}
		var body []byte
		if enc != nil {
			body = enc.Bodies[i]
		} else {
			// The parent tags change after insertion and live only in
			// their columns; reads put them back.
			b := m
			b.CondenseParent, b.TruncationParent = "", ""
			var err error
			if body, err = schema.Marshal(&b); err != nil {
				return x, fmt.Errorf("encode message %s: %w", m.ID, err)
			}
		}
		x.msgs = append(x.msgs, encodedMessage{m: m, before: ins.Before, body: body})
	}
	for _, t := range ch.Tags {
		if _, err := tagColumn(t.Field); err != nil {
			return x, err
		}
	}
	x.deletes = ch.Delete
	if ch.State.ConversationID != "" {
		if ch.State.ConversationID != x.conv {
			return x, fmt.Errorf("state names conversation %q, input is for %q", ch.State.ConversationID, x.conv)
		}
		if enc != nil {
			x.state = enc.State
		} else {
			st, err := schema.Marshal(&ch.State)
			if err != nil {
				return x, fmt.Errorf("encode state: %w", err)
			}
			x.state = st
		}
	}
	for i, ev := range ch.Events {
		if ev == nil {
			return x, errors.New("nil event")
		}
		h := ev.Header()
		if h.ID == "" || h.Type == "" {
			return x, fmt.Errorf("event %q of type %q needs an id and a type", h.ID, h.Type)
		}
		// An invalid subject token would make the relay fail on this row
		// forever and hold every later event back.
		if !schema.ValidConversationKey(h.ConversationID) {
			return x, fmt.Errorf("event %s: conversation id %q is not a valid subject token", h.ID, h.ConversationID)
		}
		var body []byte
		if enc != nil {
			body = enc.Events[i]
		} else {
			var err error
			if body, err = schema.Marshal(ev); err != nil {
				return x, fmt.Errorf("encode event %s: %w", h.ID, err)
			}
		}
		x.events = append(x.events, encodedEvent{h: h, ref: eventRef(ev), subject: schema.EventSubject(ev), body: body})
	}
	return x, nil
}

// eventRef is the summary or marker id that a condense or truncation event
// names, so a rewind can find it without decoding bodies.
func eventRef(e schema.Event) string {
	switch v := e.(type) {
	case *schema.CondenseContext:
		return v.CondenseID
	case *schema.SlidingWindowTruncation:
		return v.TruncationID
	}
	return ""
}

func tagColumn(f schema.TagField) (string, error) {
	switch f {
	case schema.TagCondenseParent:
		return "condense_parent", nil
	case schema.TagTruncationParent:
		return "truncation_parent", nil
	}
	return "", fmt.Errorf("unknown tag field %q", f)
}
