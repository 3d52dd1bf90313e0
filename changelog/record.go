package changelog

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"unicode/utf8"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/store"
)

// Version is the record format; a follower refuses a record of another.
//
// Version 2 carries the bytes the store writes (inputs' stored payloads,
// message bodies, states, events) as they are, after a JSON head that
// describes everything else; version 1 was one JSON document, whose
// payloads were base64 and whose messages had to be decoded and encoded
// again by each reader.
const Version = 2

// Record is one partition's part of one commit: a store.Group.
type Record struct {
	Partition int
	At        int64 // commit time, Unix milliseconds
	Entries   []store.Entry
}

// A record is its head, a JSON document on one line, then a newline, then
// the data: every byte string the head counts, in the order the head names
// them (per entry: the input's stored payload, each inserted message's
// body, the state, each event), each as long as the head says, nothing
// between them. The head is compact JSON, so its first newline is its end.
// An applied turn carries no payload: its message's body holds the turn
// (store.Entry.StoredInput), and a replay of a record that still carries
// one stores none. The byte strings are the store's own
// (store.EncodedChanges): a replay writes them unchanged, so its rows are
// the live commit's rows whatever they hold, and reading them costs no
// decoding.
type wireRecord struct {
	V       int         `json:"v"`
	P       int         `json:"p"`
	At      int64       `json:"at"`
	Entries []wireEntry `json:"entries"`
}

type wireEntry struct {
	Input   wireInput    `json:"input"`
	Changes *wireChanges `json:"changes,omitempty"`
}

// wireInput is an input in its stored form (a rejected payload's prefix
// with the whole one's hash and size). A rejected input's strings come
// from the wire as they were, so they are texts.
type wireInput struct {
	ID             text `json:"id"`
	ConversationID text `json:"conversation_id,omitempty"`
	Kind           text `json:"kind"`
	// Subject is left out when it is the conversation's input subject of
	// the kind (schema.InputSubject), as it is but for rejected inputs.
	Subject *text `json:"subject,omitempty"`
	TS      int64 `json:"ts"`
	// Payload is the stored payload's length in the data; -1 for none
	// (the row's payload is NULL).
	Payload int          `json:"payload"`
	Hash    []byte       `json:"hash"`
	Size    int          `json:"size"`
	Status  store.Status `json:"status"`
	Reason  text         `json:"reason,omitempty"`
}

// text is a string kept byte for byte: a JSON string when it is valid
// UTF-8 (always, but for what a hostile publisher put in a subject), else
// {"b64": its bytes in base64}. A JSON string alone would carry invalid
// UTF-8 as U+FFFD, and the rebuilt row would differ from the stored one.
type text string

func (t text) MarshalJSONTo(enc *jsontext.Encoder) error {
	if utf8.ValidString(string(t)) {
		return enc.WriteToken(jsontext.String(string(t)))
	}
	return enc.WriteValue(jsontext.Value(`{"b64":"` + base64.StdEncoding.EncodeToString([]byte(t)) + `"}`))
}

func (t *text) UnmarshalJSONFrom(dec *jsontext.Decoder) error {
	if dec.PeekKind() == '"' {
		tok, err := dec.ReadToken()
		*t = text(tok.String())
		return err
	}
	var raw struct {
		B64 []byte `json:"b64"`
	}
	if err := jsonv2.UnmarshalDecode(dec, &raw); err != nil {
		return err
	}
	*t = text(raw.B64)
	return nil
}

type wireChanges struct {
	Insert []wireInsertion    `json:"insert,omitempty"`
	Tags   []schema.TagChange `json:"tags,omitempty"`
	Delete []string           `json:"delete,omitempty"`
	// State is the stored state's length in the data; 0 when the entry
	// leaves the state alone (a state is never empty JSON).
	State int `json:"state,omitzero"`
	// Events are the lengths of the events' JSON in the data.
	Events []int `json:"events,omitempty"`
}

// wireInsertion is an inserted message's columns; its body (its JSON
// without the parent tags) is in the data. The id and the ts are left out
// when they are the input's, as they are for a turn.
type wireInsertion struct {
	ID                 string      `json:"id,omitempty"`
	Before             string      `json:"before,omitempty"`
	TS                 *int64      `json:"ts,omitempty"`
	Role               schema.Role `json:"role"`
	IsSummary          bool        `json:"is_summary,omitzero"`
	CondenseID         string      `json:"condense_id,omitempty"`
	CondenseParent     string      `json:"condense_parent,omitempty"`
	IsTruncationMarker bool        `json:"is_truncation_marker,omitzero"`
	TruncationID       string      `json:"truncation_id,omitempty"`
	TruncationParent   string      `json:"truncation_parent,omitempty"`
	Tokens             int         `json:"tokens"`
	Body               int         `json:"body"`
}

// Encode writes a record. Each entry's changes are encoded as the store
// encodes them (store.EncodeChanges), or taken from its Encoded when set,
// so a decoded record encodes again to the same bytes. An entry the store
// would refuse is refused here too.
func Encode(r Record) ([]byte, error) {
	w := wireRecord{V: Version, P: r.Partition, At: r.At, Entries: make([]wireEntry, len(r.Entries))}
	var data [][]byte
	size := 0
	add := func(b []byte) int {
		data = append(data, b)
		size += len(b)
		return len(b)
	}
	for i, e := range r.Entries {
		in := e.StoredInput()
		we := wireEntry{Input: wireInput{
			ID: text(in.ID), ConversationID: text(in.ConversationID), Kind: text(in.Kind), TS: in.TS,
			Payload: -1, Hash: in.Stored.Hash[:], Size: in.Stored.Size, Status: in.Status, Reason: text(in.Reason),
		}}
		if in.ConversationID == "" || in.Subject != schema.InputSubject(in.ConversationID, schema.InputKind(in.Kind)) {
			subject := text(in.Subject)
			we.Input.Subject = &subject
		}
		if in.Payload != nil {
			we.Input.Payload = add(in.Payload)
		}
		if ch := e.Changes; ch != nil {
			enc := e.Encoded
			if enc == nil {
				var err error
				if enc, err = store.EncodeChanges(store.Entry{Input: in, Changes: ch}); err != nil {
					return nil, fmt.Errorf("encode changes of input %s: %w", in.ID, err)
				}
			}
			if len(enc.Bodies) != len(ch.Insert) || len(enc.Events) != len(ch.Events) {
				return nil, fmt.Errorf("encode changes of input %s: encoded changes do not match them", in.ID)
			}
			wc := &wireChanges{Tags: ch.Tags, Delete: ch.Delete}
			if len(ch.Insert) > 0 {
				wc.Insert = make([]wireInsertion, len(ch.Insert))
			}
			for k, ins := range ch.Insert {
				m := &ins.Message
				wi := wireInsertion{Before: ins.Before, Role: m.Role,
					IsSummary: m.IsSummary, CondenseID: m.CondenseID, CondenseParent: m.CondenseParent,
					IsTruncationMarker: m.IsTruncationMarker, TruncationID: m.TruncationID, TruncationParent: m.TruncationParent,
					Tokens: m.Tokens, Body: add(enc.Bodies[k])}
				if m.ID != in.ID {
					wi.ID = m.ID
				}
				if m.TS != in.TS {
					wi.TS = &m.TS
				}
				wc.Insert[k] = wi
			}
			if enc.State != nil {
				wc.State = add(enc.State)
			}
			for _, ev := range enc.Events {
				wc.Events = append(wc.Events, add(ev))
			}
			we.Changes = wc
		}
		w.Entries[i] = we
	}
	head, err := jsonv2.Marshal(&w)
	if err != nil {
		return nil, fmt.Errorf("encode changelog record: %w", err)
	}
	out := make([]byte, 0, len(head)+1+size)
	out = append(append(out, head...), '\n')
	for _, b := range data {
		out = append(out, b...)
	}
	return out, nil
}

// errShort is the error for a record whose data ends before its head says.
var errShort = errors.New("changelog record: the data is shorter than the head says")

// Decode reads a record Encode wrote. Its entries carry the store's bytes
// (store.Entry.Encoded) and, beside them, only what the store needs: the
// inserted messages have their column fields but no content, and
// Changes.State only its ConversationID (the rest is in the bytes). The
// events are decoded. The byte strings share data's memory.
func Decode(data []byte) (Record, error) {
	head, rest, found := bytes.Cut(data, []byte{'\n'})
	var w wireRecord
	if err := jsonv2.Unmarshal(head, &w); err != nil {
		return Record{}, fmt.Errorf("decode changelog record: %w", err)
	}
	if w.V != Version {
		return Record{}, fmt.Errorf("changelog record version %d, this build reads %d", w.V, Version)
	}
	if !found {
		return Record{}, errors.New("changelog record: no newline after the head")
	}
	take := func(n int) ([]byte, error) {
		if n < 0 || n > len(rest) {
			return nil, errShort
		}
		b := rest[:n:n]
		rest = rest[n:]
		return b, nil
	}
	r := Record{Partition: w.P, At: w.At, Entries: make([]store.Entry, len(w.Entries))}
	for i := range w.Entries {
		we := &w.Entries[i]
		if len(we.Input.Hash) != 32 {
			return Record{}, errors.New("changelog record: input hash is not 32 bytes")
		}
		sp := &store.StoredPayload{Size: we.Input.Size}
		copy(sp.Hash[:], we.Input.Hash)
		e := store.Entry{Input: store.InputRecord{
			ID: string(we.Input.ID), ConversationID: string(we.Input.ConversationID), Kind: string(we.Input.Kind),
			TS: we.Input.TS, Status: we.Input.Status, Reason: string(we.Input.Reason), Stored: sp,
		}}
		if we.Input.Subject != nil {
			e.Input.Subject = string(*we.Input.Subject)
		} else if e.Input.ConversationID != "" {
			e.Input.Subject = schema.InputSubject(e.Input.ConversationID, schema.InputKind(e.Input.Kind))
		} else {
			return Record{}, errors.New("changelog record: an input with neither a subject nor a conversation")
		}
		if we.Input.Payload >= 0 {
			p, err := take(we.Input.Payload)
			if err != nil {
				return Record{}, err
			}
			e.Input.Payload = p
		}
		if wc := we.Changes; wc != nil {
			ch := &schema.Changes{Tags: wc.Tags, Delete: wc.Delete}
			enc := &store.EncodedChanges{}
			if len(wc.Insert) > 0 {
				ch.Insert = make([]schema.Insertion, len(wc.Insert))
				enc.Bodies = make([][]byte, len(wc.Insert))
			}
			for k := range wc.Insert {
				wi := &wc.Insert[k]
				body, err := take(wi.Body)
				if err != nil {
					return Record{}, err
				}
				enc.Bodies[k] = body
				m := &ch.Insert[k].Message
				ch.Insert[k].Before = wi.Before
				m.ID, m.ConversationID, m.TS, m.Role, m.Tokens = wi.ID, e.Input.ConversationID, e.Input.TS, wi.Role, wi.Tokens
				if m.ID == "" {
					m.ID = e.Input.ID
				}
				if wi.TS != nil {
					m.TS = *wi.TS
				}
				m.IsSummary, m.CondenseID, m.CondenseParent = wi.IsSummary, wi.CondenseID, wi.CondenseParent
				m.IsTruncationMarker, m.TruncationID, m.TruncationParent = wi.IsTruncationMarker, wi.TruncationID, wi.TruncationParent
			}
			if wc.State > 0 {
				st, err := take(wc.State)
				if err != nil {
					return Record{}, err
				}
				enc.State = st
				ch.State.ConversationID = e.Input.ConversationID
			}
			for k, n := range wc.Events {
				b, err := take(n)
				if err != nil {
					return Record{}, err
				}
				ev, err := schema.DecodeEvent(b)
				if err != nil {
					return Record{}, fmt.Errorf("changelog record: event %d of input %s: %w", k, e.Input.ID, err)
				}
				ch.Events = append(ch.Events, ev)
				enc.Events = append(enc.Events, b)
			}
			e.Changes, e.Encoded = ch, enc
		}
		r.Entries[i] = e
	}
	if len(rest) > 0 {
		return Record{}, fmt.Errorf("changelog record: %d bytes of data after the last the head names", len(rest))
	}
	return r, nil
}
