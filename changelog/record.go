// Package changelog holds CTX_STATE, the log every committed change goes to
// before it is committed to SQLite: its record format, how a record is cut
// into messages that fit the server's max payload and put back together,
// and the JetStream effects (appending with a per-partition fence, following
// the stream). An instance's SQLite database is a projection of this log, so
// another instance can take a partition over, or a database be rebuilt,
// from the streams alone: replaying a record runs no LLM call and counts no
// token, it stores what the record says.
package changelog

import (
	"errors"
	"fmt"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/store"
)

// Version is the record format; a follower refuses a record of another.
const Version = 1

// Record is one partition's part of one commit: a store.Group.
type Record struct {
	Partition int
	At        int64 // commit time, Unix milliseconds
	Entries   []store.Entry
}

// wire forms. Inputs travel in their stored form (a rejected payload's
// prefix with the whole one's hash and size); events as their own JSON.
type wireRecord struct {
	V       int         `json:"v"`
	P       int         `json:"p"`
	At      int64       `json:"at"`
	Entries []wireEntry `json:"entries"`
}

type wireEntry struct {
	Input   wireInput        `json:"input"`
	Changes *schema.Changes  `json:"changes,omitempty"`
	Events  []jsontext.Value `json:"events,omitempty"`
}

type wireInput struct {
	ID             string       `json:"id"`
	ConversationID string       `json:"conversation_id,omitempty"`
	Kind           string       `json:"kind"`
	Subject        string       `json:"subject"`
	TS             int64        `json:"ts"`
	Payload        []byte       `json:"payload"`
	Hash           []byte       `json:"hash"`
	Size           int          `json:"size"`
	Status         store.Status `json:"status"`
	Reason         string       `json:"reason,omitempty"`
}

// Encode writes a record as JSON.
func Encode(r Record) ([]byte, error) {
	w := wireRecord{V: Version, P: r.Partition, At: r.At, Entries: make([]wireEntry, len(r.Entries))}
	for i, e := range r.Entries {
		in := e.Input.StoredForm()
		we := wireEntry{Input: wireInput{
			ID: in.ID, ConversationID: in.ConversationID, Kind: in.Kind, Subject: in.Subject, TS: in.TS,
			Payload: in.Payload, Hash: in.Stored.Hash[:], Size: in.Stored.Size, Status: in.Status, Reason: in.Reason,
		}}
		if e.Changes != nil {
			we.Changes = e.Changes
			for _, ev := range e.Changes.Events {
				b, err := schema.Marshal(ev)
				if err != nil {
					return nil, fmt.Errorf("encode event of input %s: %w", in.ID, err)
				}
				we.Events = append(we.Events, b)
			}
		}
		w.Entries[i] = we
	}
	return schema.Marshal(&w)
}

// Decode reads a record Encode wrote.
func Decode(data []byte) (Record, error) {
	var w wireRecord
	if err := jsonv2.Unmarshal(data, &w); err != nil {
		return Record{}, fmt.Errorf("decode changelog record: %w", err)
	}
	if w.V != Version {
		return Record{}, fmt.Errorf("changelog record version %d, this build reads %d", w.V, Version)
	}
	r := Record{Partition: w.P, At: w.At, Entries: make([]store.Entry, len(w.Entries))}
	for i, we := range w.Entries {
		if len(we.Input.Hash) != 32 {
			return Record{}, errors.New("changelog record: input hash is not 32 bytes")
		}
		sp := &store.StoredPayload{Size: we.Input.Size}
		copy(sp.Hash[:], we.Input.Hash)
		e := store.Entry{Input: store.InputRecord{
			ID: we.Input.ID, ConversationID: we.Input.ConversationID, Kind: we.Input.Kind, Subject: we.Input.Subject,
			TS: we.Input.TS, Payload: we.Input.Payload, Status: we.Input.Status, Reason: we.Input.Reason, Stored: sp,
		}}
		if we.Changes != nil {
			e.Changes = we.Changes
			for _, raw := range we.Events {
				ev, err := schema.DecodeEvent(raw)
				if err != nil {
					return Record{}, fmt.Errorf("changelog record: event of input %s: %w", we.Input.ID, err)
				}
				e.Changes.Events = append(e.Changes.Events, ev)
			}
		}
		r.Entries[i] = e
	}
	return r, nil
}
