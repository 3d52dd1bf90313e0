package changelog_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/ctxpipe/ctxpipe/changelog"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/store"
)

// recordWithTurnPayload is a record as the service wrote it while an applied
// turn's row kept its payload beside its message (the format is the same):
// acme's turn, carried twice (its payload as published, upper-case id and
// all, and its message's body), an applied manual condense and a rejected
// turn.
const recordWithTurnPayload = "{\"v\":2,\"p\":5,\"at\":1750000000003,\"entries\":[{\"input\":{\"id\":\"5d0c2b1a-3e4f-4a5b-8c6d-7e8f9a0b1c2d\",\"conversation_id\":\"acme.c1\",\"kind\":\"turn\",\"ts\":1750000000000,\"payload\":136,\"hash\":\"OM3QqlcxGWczRbOeGcwKOKA7s2XyuUeX0/6LxtYH3OE=\",\"size\":136,\"status\":\"applied\"},\"changes\":{\"insert\":[{\"role\":\"user\",\"tokens\":4,\"body\":144}],\"state\":153}},{\"input\":{\"id\":\"6d0c2b1a-3e4f-4a5b-8c6d-7e8f9a0b1c2d\",\"conversation_id\":\"acme.c1\",\"kind\":\"condense\",\"ts\":1750000000001,\"payload\":83,\"hash\":\"Sv78iW6ADai2M++kEyM7aNArjuBmkvPYExuWbg40ots=\",\"size\":83,\"status\":\"applied\"}},{\"input\":{\"id\":\"7d0c2b1a-3e4f-4a5b-8c6d-7e8f9a0b1c2d\",\"conversation_id\":\"acme.c1\",\"kind\":\"turn\",\"ts\":1750000000002,\"payload\":80,\"hash\":\"4X8wch/ergYyXvqdrVJxRnnyPwFQ3mkwBk1EEG9qgqU=\",\"size\":80,\"status\":\"rejected\",\"reason\":\"bad_role\"}}]}\n{\"id\": \"5D0C2B1A-3E4F-4A5B-8C6D-7E8F9A0B1C2D\",\n \"conversation_id\":\"c1\", \"ts\":1750000000000,\"role\":\"user\",\"content\":\"stored once \\u00e9\"}{\"id\":\"5d0c2b1a-3e4f-4a5b-8c6d-7e8f9a0b1c2d\",\"conversation_id\":\"acme.c1\",\"ts\":1750000000000,\"role\":\"user\",\"content\":\"stored once é\",\"tokens\":4}{\"conversation_id\":\"acme.c1\",\"profile_id\":\"\",\"context_tokens\":4,\"system_tokens\":0,\"messages\":1,\"condensations\":0,\"truncations\":0,\"last_ts\":1750000000000}{\"id\":\"6d0c2b1a-3e4f-4a5b-8c6d-7e8f9a0b1c2d\",\"ts\":1750000000001,\"trigger\":\"manual\"}{\"id\":\"7d0c2b1a-3e4f-4a5b-8c6d-7e8f9a0b1c2d\",\"ts\":1750000000002,\"role\":\"system\"}"

// The same inputs as the service commits them now, with their payloads as
// received.
func liveEntriesOfRecordWithTurnPayload() []store.Entry {
	const conv = "acme.c1"
	id, cid, rid := "5d0c2b1a-3e4f-4a5b-8c6d-7e8f9a0b1c2d", "6d0c2b1a-3e4f-4a5b-8c6d-7e8f9a0b1c2d", "7d0c2b1a-3e4f-4a5b-8c6d-7e8f9a0b1c2d"
	payload := []byte("{\"id\": \"5D0C2B1A-3E4F-4A5B-8C6D-7E8F9A0B1C2D\",\n \"conversation_id\":\"c1\", \"ts\":1750000000000,\"role\":\"user\",\"content\":\"stored once \\u00e9\"}")
	m := schema.Message{Turn: schema.Turn{ID: id, ConversationID: conv, TS: 1750000000000, Role: schema.RoleUser,
		Content: schema.TextContent("stored once é")}, Tokens: 4}
	st := schema.ConversationState{ConversationID: conv, Messages: 1, ContextTokens: 4, LastTS: 1750000000000}
	return []store.Entry{
		{Input: store.InputRecord{ID: id, ConversationID: conv, Kind: "turn", Subject: schema.InputSubject(conv, schema.KindTurn),
			TS: 1750000000000, Payload: payload, Status: store.StatusApplied},
			Changes: &schema.Changes{Insert: []schema.Insertion{{Message: m}}, State: st}},
		{Input: store.InputRecord{ID: cid, ConversationID: conv, Kind: "condense", Subject: schema.InputSubject(conv, schema.KindCondense),
			TS: 1750000000001, Payload: []byte(`{"id":"` + cid + `","ts":1750000000001,"trigger":"manual"}`), Status: store.StatusApplied}},
		{Input: store.InputRecord{ID: rid, ConversationID: conv, Kind: "turn", Subject: schema.InputSubject(conv, schema.KindTurn),
			TS: 1750000000002, Payload: []byte(`{"id":"` + rid + `","ts":1750000000002,"role":"system"}`),
			Status: store.StatusRejected, Reason: "bad_role"}},
	}
}

// A record that carries an applied turn's payload beside its message replays
// into the rows a live commit writes now (the turn's bytes in its message
// only, its hash and size kept), and the record the service writes for the
// same inputs carries the turn once: the old one less the payload.
func TestRecordWithTurnPayloadReplaysIntoBytesOnce(t *testing.T) {
	ctx := context.Background()
	old, err := changelog.Decode([]byte(recordWithTurnPayload))
	if err != nil {
		t.Fatal(err)
	}
	if len(old.Entries[0].Input.Payload) != 136 {
		t.Fatalf("the old record's turn carries %d payload bytes, want 136", len(old.Entries[0].Input.Payload))
	}
	replayed := openStore(t, "replayed.db", store.WithBulkLoad())
	replay(t, replayed, []changelog.Record{old})

	live := openStore(t, "live.db")
	entries := liveEntriesOfRecordWithTurnPayload()
	tx, err := live.Begin(ctx, []store.Group{{At: old.At, Entries: entries, Published: true}})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(map[int]uint64{old.Partition: 1}, 1); err != nil {
		t.Fatal(err)
	}
	identical(t, live, replayed)

	// The history reads the message's body byte for byte.
	_, bodies, err := replayed.MessagesRaw(ctx, "acme.c1")
	if err != nil || len(bodies) != 1 || !bytes.Equal(bodies[0], old.Entries[0].Encoded.Bodies[0]) {
		t.Fatalf("history bodies %q, %v; want the record's body %q", bodies, err, old.Entries[0].Encoded.Bodies[0])
	}
	// A redelivery of the turn is a duplicate; the same id with other bytes
	// a reused id: the hash is what tells them apart.
	redeliver := entries[0]
	redeliver.Changes = nil
	other := redeliver
	other.Input.Payload = append(bytes.Clone(other.Input.Payload), ' ')
	for _, st := range []*store.Store{live, replayed} {
		res, err := st.Commit(ctx, []store.Entry{redeliver})
		if err != nil || !res[0].Duplicate || res[0].Conflict {
			t.Fatalf("%s: redelivery %+v, %v; want a plain duplicate", st.Path(), res, err)
		}
		res, err = st.Commit(ctx, []store.Entry{other})
		if err != nil || !res[0].Duplicate || !res[0].Conflict {
			t.Fatalf("%s: other bytes under the id %+v, %v; want a reused id", st.Path(), res, err)
		}
	}

	rec := changelog.Record{Partition: old.Partition, At: old.At, Entries: entries}
	data, err := changelog.Encode(rec)
	if err != nil {
		t.Fatal(err)
	}
	if want := len(recordWithTurnPayload) - 136 - len(`136`) + len(`-1`); len(data) != want {
		t.Fatalf("the record is %d bytes, want %d (the old one less the turn's payload)", len(data), want)
	}
	again, err := changelog.Encode(old)
	if err != nil || !bytes.Equal(again, data) {
		t.Fatalf("the old record encodes again to %q, %v; want %q", again, err, data)
	}
	d, err := changelog.Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	if in := d.Entries[0].Input; in.Payload != nil || in.Stored.Size != 136 || in.Stored.Hash != store.PayloadHash(entries[0].Input.Payload) {
		t.Fatalf("the turn's input decodes as %+v, want no payload with the whole one's hash and size", in)
	}
	for i, want := range []int{83, 80} {
		if n := len(d.Entries[i+1].Input.Payload); n != want {
			t.Fatalf("entry %d carries %d payload bytes, want %d", i+1, n, want)
		}
	}
}
