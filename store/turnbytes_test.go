package store

import (
	"context"
	"testing"

	"github.com/ctxpipe/ctxpipe/schema"
)

func TestPayloadInMessage(t *testing.T) {
	const id = "5d0c2b1a-3e4f-4a5b-8c6d-7e8f9a0b1c2d"
	turn := InputRecord{ID: id, Kind: string(schema.KindTurn), Status: StatusApplied}
	with := func(in InputRecord, f func(*InputRecord)) InputRecord { f(&in); return in }
	inserts := func(ids ...string) *schema.Changes {
		ch := &schema.Changes{}
		for _, id := range ids {
			ch.Insert = append(ch.Insert, schema.Insertion{Message: schema.Message{Turn: schema.Turn{ID: id}}})
		}
		return ch
	}
	tests := []struct {
		name string
		in   InputRecord
		ch   *schema.Changes
		want bool
	}{
		{"applied turn inserting its message", turn, inserts(id), true},
		{"its message after a summary and a marker", turn, inserts("sum", "marker", id), true},
		{"its message under the id in upper case", turn, inserts("5D0C2B1A-3E4F-4A5B-8C6D-7E8F9A0B1C2D"), true},
		{"applied turn without changes", turn, nil, false},
		{"applied turn inserting other messages only", turn, inserts("sum"), false},
		{"rejected turn", with(turn, func(in *InputRecord) { in.Status = StatusRejected }), inserts(id), false},
		{"applied condense", with(turn, func(in *InputRecord) { in.Kind = string(schema.KindCondense) }), inserts(id), false},
		{"applied pin", with(turn, func(in *InputRecord) { in.Kind = string(schema.KindPin) }), inserts(id), false},
	}
	for _, tc := range tests {
		if got := payloadInMessage(tc.in, tc.ch); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A database written while applied turns kept their payloads, one of them
// rewound since, comes out of migration 11 holding the rows a database
// written now holds (store.Diff), and its history reads the same.
func TestMigrationStoresTurnBytesOnce(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	t1, t2 := turnEntry("acme.c1", msg("acme.c1", "", 1, schema.RoleUser, "first")), turnEntry("acme.c1", msg("acme.c1", "", 2, schema.RoleAssistant, "second"))
	for i, e := range []*Entry{&t1, &t2} {
		e.Input.TS = int64(i + 1)
		e.Changes.Insert[0].Message.ID = e.Input.ID
		e.Input.Payload = []byte(`{"id":"` + e.Input.ID + `", "content": "as published"}`)
	}
	rewind := Entry{Input: input("acme.c1", schema.KindRewind), Changes: &schema.Changes{Delete: []string{t2.Input.ID}}}
	cond := Entry{Input: input("acme.c1", schema.KindCondense), Changes: &schema.Changes{}}
	rej := rejectedEntry("acme.c1", []byte(`{"role":"system"}`))
	batches := [][]Entry{{t1, t2}, {rewind, cond, rej}}
	at := int64(1750000000000)
	write := func(path string) *Store {
		s, err := Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		for i, b := range batches {
			tx, err := s.Begin(ctx, []Group{{At: at + int64(i), Entries: b, Published: true}})
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(nil, 0); err != nil {
				t.Fatal(err)
			}
		}
		return s
	}
	now := write(dir + "/now.db")
	defer now.Close()

	// The old database: the applied turns' rows hold their payloads, and
	// migration 11 has not run.
	old := write(dir + "/old.db")
	for _, e := range []Entry{t1, t2} {
		if _, err := old.w.ExecContext(ctx, `UPDATE inputs SET payload = ? WHERE id = ?`, e.Input.Payload, e.Input.ID); err != nil {
			t.Fatal(err)
		}
	}
	// Nor has any later one: migrate runs those above the highest version
	// applied, so they are undone too (12 added the outbox's held columns).
	for _, q := range []string{`DELETE FROM schema_version WHERE version >= 11`, `DROP INDEX outbox_held`,
		`ALTER TABLE outbox DROP COLUMN conv`, `ALTER TABLE outbox DROP COLUMN held_since`} {
		if _, err := old.w.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if report, err := Diff(ctx, now.Path(), old.Path()); err != nil || report.Identical() {
		t.Fatalf("before the migration the files compare identical (%v): the test proves nothing", err)
	}
	old.Close()
	migrated, err := Open(ctx, dir+"/old.db")
	if err != nil {
		t.Fatal(err)
	}
	defer migrated.Close()
	report, err := Diff(ctx, now.Path(), migrated.Path())
	if err != nil {
		t.Fatal(err)
	}
	if !report.Identical() {
		t.Fatalf("the migrated file differs from one written now:\n%s", report)
	}
	for _, e := range []Entry{t1, t2, rewind, cond, rej} {
		p, hash, size, valid := storedInput(t, migrated, e.Input.ID)
		want := PayloadHash(e.Input.Payload)
		applied := e.Input.Status == StatusApplied && e.Input.Kind == string(schema.KindTurn)
		if valid == applied || string(hash) != string(want[:]) || size != len(e.Input.Payload) {
			t.Errorf("input %s (%s, %s): payload %q, hash %x, size %d", e.Input.ID, e.Input.Kind, e.Input.Status, p, hash, size)
		}
	}
	_, bodies, err := migrated.MessagesRaw(ctx, "acme.c1")
	_, want, err2 := now.MessagesRaw(ctx, "acme.c1")
	if err != nil || err2 != nil || len(bodies) != 1 || string(bodies[0]) != string(want[0]) {
		t.Fatalf("history %q (%v), want %q (%v)", bodies, err, want, err2)
	}
}
