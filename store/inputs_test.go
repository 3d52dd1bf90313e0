package store

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/google/uuid"
)

// storedInput reads an inputs row as stored.
func storedInput(t *testing.T, s *Store, id string) (payload, hash []byte, size int, valid bool) {
	t.Helper()
	var p []byte
	err := s.r.QueryRowContext(context.Background(), "SELECT payload, payload_hash, payload_size FROM inputs WHERE id = ?", id).
		Scan(&p, &hash, &size)
	if err != nil {
		t.Fatalf("read input %s: %v", id, err)
	}
	return p, hash, size, p != nil
}

func rejectedEntry(conv string, payload []byte) Entry {
	in := input(conv, schema.KindTurn)
	in.Payload, in.Status, in.Reason = payload, StatusRejected, string(schema.ReasonTooLarge)
	return Entry{Input: in}
}

// Item 7: a rejected input keeps a bounded prefix of its payload; an applied
// turn keeps none of it (its message holds the turn); any other applied
// input keeps all of it. Every row keeps the whole payload's hash and size.
func TestPayloadStoredBoundedWhenRejected(t *testing.T) {
	big := bytes.Repeat([]byte("x"), 8<<20)
	tests := []struct {
		name    string
		kind    schema.InputKind
		status  Status
		message bool // the changes insert a message with the input's id
		payload []byte
		keep    int // -1: NULL
	}{
		{"rejected 8 MiB keeps the prefix", schema.KindTurn, StatusRejected, false, big, RejectedPayloadPrefix},
		{"rejected one byte over the prefix", schema.KindTurn, StatusRejected, false, big[:RejectedPayloadPrefix+1], RejectedPayloadPrefix},
		{"rejected small keeps all", schema.KindTurn, StatusRejected, false, []byte(`{"role":"system"}`), 17},
		{"applied turn keeps none: its message holds it", schema.KindTurn, StatusApplied, true, big[:1<<20], -1},
		{"applied turn without its message keeps all", schema.KindTurn, StatusApplied, false, big[:1<<20], 1 << 20},
		{"applied condense keeps all", schema.KindCondense, StatusApplied, false, []byte(`{"trigger":"manual"}`), 20},
		{"applied pin keeps all, also when it inserts", schema.KindPin, StatusApplied, true, []byte(`{"pinned":true}`), 15},
	}
	s := openStore(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := turnEntry("c")
			e.Input = input("c", tc.kind)
			e.Input.Payload, e.Input.Status = tc.payload, tc.status
			if tc.status == StatusRejected {
				e.Changes, e.Input.Reason = nil, string(schema.ReasonTooLarge)
			}
			if tc.message {
				e.Changes.Insert = []schema.Insertion{{Message: msg("c", e.Input.ID, 1, schema.RoleUser, "the turn")}}
			}
			commit(t, s, e)
			p, hash, size, valid := storedInput(t, s, e.Input.ID)
			if tc.keep < 0 {
				if valid {
					t.Errorf("stored %d payload bytes, want NULL", len(p))
				}
			} else if !valid || len(p) != tc.keep || !bytes.Equal(p, tc.payload[:tc.keep]) {
				t.Errorf("stored %d payload bytes, want the first %d", len(p), tc.keep)
			}
			if want := PayloadHash(tc.payload); !bytes.Equal(hash, want[:]) {
				t.Errorf("payload_hash = %x, want %x", hash, want)
			}
			if size != len(tc.payload) {
				t.Errorf("payload_size = %d, want %d", size, len(tc.payload))
			}
			if want := e.StoredInput(); (want.Payload == nil) != (tc.keep < 0) || len(want.Payload) != max(tc.keep, 0) {
				t.Errorf("StoredInput keeps %d payload bytes (nil %v), the row %d", len(want.Payload), want.Payload == nil, tc.keep)
			}
		})
	}
}

// Item 8: Commit tells an identical redelivery from a reused id.
func TestCommitReportsReusedID(t *testing.T) {
	s := openStore(t)
	first := turnEntry("c", msg("c", "m1", 1, schema.RoleUser, "one"))
	commit(t, s, first)
	rejected := rejectedEntry("c", []byte("not json"))
	commit(t, s, rejected)

	with := func(e Entry, conv string, payload []byte) Entry {
		e.Input.ConversationID, e.Input.Payload = conv, payload
		e.Changes = &schema.Changes{Insert: []schema.Insertion{{Message: msg(conv, uuid.NewString(), 9, schema.RoleUser, "dup")}}}
		return e
	}
	tests := []struct {
		name     string
		entry    Entry
		conflict bool
	}{
		{"identical redelivery", with(first, "c", first.Input.Payload), false},
		{"identical rejected redelivery", rejected, false},
		{"same id, other payload", with(first, "c", []byte(`{"other":1}`)), true},
		{"same id, other conversation", with(first, "d", first.Input.Payload), true},
		{"rejected id reused", with(rejected, "c", []byte(`{"fixed":true}`)), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.conflict && tc.entry.Input.Status == StatusApplied {
				// An applied input with changes fails its batch instead.
				if _, err := s.Commit(context.Background(), []Entry{tc.entry}); !errors.Is(err, ErrIDConflict) {
					t.Fatalf("commit: %v, want ErrIDConflict", err)
				}
				return
			}
			res := commit(t, s, tc.entry)
			want := Result{InputID: tc.entry.Input.ID, Duplicate: true, Conflict: tc.conflict}
			if res[0] != want {
				t.Fatalf("result = %+v, want %+v", res[0], want)
			}
		})
	}
	// Inside one batch too: the second entry meets the first one's row.
	a := turnEntry("e", msg("e", "e1", 1, schema.RoleUser, "a"))
	b := with(a, "e", []byte(`{"b":2}`))
	if _, err := s.Commit(context.Background(), []Entry{a, b}); !errors.Is(err, ErrIDConflict) {
		t.Fatalf("batch commit: %v, want ErrIDConflict for the second entry", err)
	}
	if got := ids(messagesOf(t, s, "c")); len(got) != 1 || len(messagesOf(t, s, "d")) != 0 {
		t.Fatalf("a duplicate's changes applied: c = %v", got)
	}
}

func TestSeenInputs(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	var batch []Entry
	var all []string
	for i := range 600 { // more than one query's worth of parameters
		conv := fmt.Sprintf("c%d", i%3)
		e := turnEntry(conv)
		if i%5 == 0 {
			e = rejectedEntry(conv, bytes.Repeat([]byte{byte(i)}, 5000+i))
		}
		batch = append(batch, e)
		all = append(all, e.Input.ID)
	}
	commit(t, s, batch...)
	unknown := uuid.NewString()
	got, err := s.SeenInputs(ctx, "", append(all, unknown))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(batch) {
		t.Fatalf("SeenInputs found %d, want %d", len(got), len(batch))
	}
	for _, e := range batch {
		want := SeenInput{ConversationID: e.Input.ConversationID, PayloadHash: PayloadHash(e.Input.Payload), Status: e.Input.Status}
		if got[e.Input.ID] != want {
			t.Fatalf("SeenInputs[%s] = %+v, want %+v", e.Input.ID, got[e.Input.ID], want)
		}
	}
	if _, ok := got[unknown]; ok {
		t.Fatal("an unknown id was reported seen")
	}
	if got, err := s.SeenInputs(ctx, "", nil); err != nil || len(got) != 0 {
		t.Fatalf("SeenInputs(nil) = %v, %v", got, err)
	}
}

// An input stored with an upper-case id, as ids were kept before they were
// kept in lower case, is found by its lower-case form: its redelivery is
// not applied a second time, and wait_for finds it.
func TestInputsStoredInUpperCaseAreFound(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	e := turnEntry("c")
	lower := e.Input.ID
	e.Input.ID = strings.ToUpper(lower)
	commit(t, s, e)
	got, err := s.SeenInputs(ctx, "", []string{lower})
	if err != nil || got[lower] != (SeenInput{ConversationID: "c", PayloadHash: PayloadHash(e.Input.Payload), Status: e.Input.Status}) {
		t.Fatalf("SeenInputs(%s) = %+v, %v", lower, got, err)
	}
	if st, _, found, err := s.InputStatusIn(ctx, "c", lower); err != nil || !found || st != e.Input.Status {
		t.Fatalf("InputStatusIn(%s) = %v, %v, %v", lower, st, found, err)
	}
}

// Item 8: wait_for must not be told another conversation's input landed.
func TestInputStatusInIsScopedToTheConversation(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	applied := turnEntry("a")
	rejected := rejectedEntry("a", []byte("x"))
	commit(t, s, applied, rejected)
	tests := []struct {
		name, conv, id string
		found          bool
		status         Status
	}{
		{"applied, same conversation", "a", applied.Input.ID, true, StatusApplied},
		{"rejected, same conversation", "a", rejected.Input.ID, true, StatusRejected},
		{"applied, other conversation", "b", applied.Input.ID, false, ""},
		{"unknown id", "a", uuid.NewString(), false, ""},
	}
	for _, tc := range tests {
		status, reason, found, err := s.InputStatusIn(ctx, tc.conv, tc.id)
		if err != nil || found != tc.found || status != tc.status {
			t.Errorf("%s: InputStatusIn = %q %q %v %v; want %q found=%v", tc.name, status, reason, found, err, tc.status, tc.found)
		}
	}
}

// A database written before migration 3 gets its hashes, sizes and bounded
// rejected payloads when it is opened.
func TestMigrationBackfillsHashesAndCutsRejectedPayloads(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open("sqlite3", dsn(path, "_journal_mode=WAL"))
	if err != nil {
		t.Fatal(err)
	}
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE schema_version (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms[:2] {
		if _, err := db.Exec(m.sql); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(`INSERT INTO schema_version VALUES (?, ?, 0)`, m.version, m.name); err != nil {
			t.Fatal(err)
		}
	}
	big := bytes.Repeat([]byte("y"), 8<<20)
	rows := []struct {
		id      string
		status  Status
		payload []byte
		keep    int
	}{
		{"too-large", StatusRejected, big, RejectedPayloadPrefix},
		// An applied turn's bytes are its message's since migration 11.
		{"applied", StatusApplied, big[:300000], 0},
		{"small-rejection", StatusRejected, []byte("{"), 1},
	}
	for i := range 300 { // more than one backfill page
		rows = append(rows, struct {
			id      string
			status  Status
			payload []byte
			keep    int
		}{fmt.Sprintf("r%d", i), StatusApplied, []byte(fmt.Sprint(i)), 0})
	}
	for _, r := range rows {
		if _, err := db.Exec(`INSERT INTO inputs (id, conversation_id, kind, subject, ts, payload, status, reason, received_at)
			VALUES (?, 'c', 'turn', 'ctx.in.c.turn', 1, ?, ?, '', 1)`, r.id, r.payload, string(r.status)); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()

	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, r := range rows {
		p, hash, size, _ := storedInput(t, s, r.id)
		want := PayloadHash(r.payload)
		if len(p) != r.keep || !bytes.Equal(hash, want[:]) || size != len(r.payload) {
			t.Fatalf("%s: %d bytes kept (want %d), hash %x (want %x), size %d (want %d)",
				r.id, len(p), r.keep, hash, want, size, len(r.payload))
		}
	}
}

// An applied input whose id another conversation took meanwhile fails its
// batch (nothing of it is stored) instead of being skipped silently: the
// caller checks again and rejects it as a reused id.
func TestCommitFailsOnIDTakenMeanwhile(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	id := uuid.NewString()
	mk := func(conv string) Entry {
		m := schema.Message{Turn: schema.Turn{ID: id, ConversationID: conv, TS: 1, Role: schema.RoleUser, Content: schema.TextContent("hi " + conv)}, Tokens: 2}
		return Entry{
			Input:   InputRecord{ID: id, ConversationID: conv, Kind: "turn", Subject: "ctx.in." + conv + ".turn", TS: 1, Payload: []byte(conv), Status: StatusApplied},
			Changes: &schema.Changes{Insert: []schema.Insertion{{Message: m}}, State: schema.ConversationState{ConversationID: conv, Messages: 1}},
		}
	}
	if _, err := s.Commit(ctx, []Entry{mk("a")}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(ctx, []Entry{mk("b")}); !errors.Is(err, ErrIDConflict) {
		t.Fatalf("commit of a taken id in another conversation: %v, want ErrIDConflict", err)
	}
	if _, found, err := s.State(ctx, "b"); err != nil || found {
		t.Fatalf("conversation b was stored (found=%v, %v)", found, err)
	}
}

// tenantTurn is an applied turn of conversation key conv (tenant.conv, or
// conv alone) under id.
func tenantTurn(conv, id string) Entry {
	e := turnEntry(conv, msg(conv, id, 1, schema.RoleUser, "hi from "+conv))
	e.Input.ID, e.Input.Payload = id, []byte(`{"id":"`+id+`","from":"`+conv+`"}`)
	return e
}

// Input ids are one namespace per tenant: the same id from two tenants, and
// from the service's own account, is three inputs, and each tenant's
// lookups find only its own. Within a tenant the id stays taken.
func TestInputIDsAreScopedToTheTenant(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	id := uuid.NewString()
	acme, globex, own := tenantTurn("acme.c1", id), tenantTurn("globex.c1", id), tenantTurn("c1", id)
	for _, e := range []Entry{acme, globex, own} {
		if res := commit(t, s, e); res[0].Duplicate {
			t.Fatalf("%s: the id another tenant used made it a duplicate: %+v", e.Input.ConversationID, res[0])
		}
	}
	for _, tc := range []struct{ tenant, conv string }{{"acme", "acme.c1"}, {"globex", "globex.c1"}, {"", "c1"}} {
		got, err := s.SeenInputs(ctx, tc.tenant, []string{id})
		if err != nil || len(got) != 1 || got[id].ConversationID != tc.conv {
			t.Errorf("SeenInputs(%q) = %+v, %v; want only %s", tc.tenant, got, err, tc.conv)
		}
		if st, _, found, err := s.InputStatusIn(ctx, tc.conv, id); err != nil || !found || st != StatusApplied {
			t.Errorf("InputStatusIn(%s) = %v %v %v", tc.conv, st, found, err)
		}
	}
	if got, err := s.SeenInputs(ctx, "initech", []string{id}); err != nil || len(got) != 0 {
		t.Errorf("a tenant that never sent the id sees %+v, %v", got, err)
	}
	for _, conv := range []string{"acme.c1", "globex.c1", "c1"} {
		if ms := messagesOf(t, s, conv); len(ms) != 1 || ms[0].ID != id {
			t.Errorf("%s holds %v, want its own message %s", conv, ids(ms), id)
		}
	}
	// Within acme the id is taken: another conversation of acme, or other
	// content, is a reused id; the same input again is a redelivery.
	if _, err := s.Commit(ctx, []Entry{tenantTurn("acme.c2", id)}); !errors.Is(err, ErrIDConflict) {
		t.Fatalf("acme reusing its id in another conversation: %v, want ErrIDConflict", err)
	}
	if res := commit(t, s, acme); !res[0].Duplicate || res[0].Conflict {
		t.Fatalf("acme's redelivery: %+v, want a plain duplicate", res[0])
	}
}

// A database written before input ids were scoped to tenants gets each row's
// tenant from its subject when it is opened, keeps its rows and rowids, and
// then takes the same id from another tenant.
func TestMigrationScopesInputsToTheirTenant(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open("sqlite3", dsn(path, "_journal_mode=WAL"))
	if err != nil {
		t.Fatal(err)
	}
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE schema_version (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.version >= 10 {
			break
		}
		if _, err := db.Exec(m.sql); err != nil {
			t.Fatalf("%s: %v", m.name, err)
		}
		if _, err := db.Exec(`INSERT INTO schema_version VALUES (?, ?, 0)`, m.version, m.name); err != nil {
			t.Fatal(err)
		}
	}
	// Subjects as inputs rows hold them: as published, whatever they were.
	subjects := []string{
		"ctx.in.c1.turn", "ctx.in.acme.c1.turn", "ctx.in.globex.c-2.condense", "ctx.in.acme.>.turn",
		"ctx.in.acme.*.overflow", "ctx.in._bad.c1.turn", "ctx.in.a.b.c.d", "ctx.in.Ac_me-9.c.pin",
		"ctx.in..c1.turn", "ctx.in.acme..turn", "ctx.in.ac.me.c1", "CTX.IN.acme.c1.turn", "ctx.inx.acme.c1.turn",
		"ctx.in." + strings.Repeat("t", 128) + ".c.turn", "ctx.in." + strings.Repeat("t", 129) + ".c.turn",
		"ctx.in.acmé.c1.turn", "ctx.in.ac me.c1.turn", "ctx.in.ac*me.c1.turn", "",
	}
	rowids := map[string]int64{}
	for i, subj := range subjects {
		id := fmt.Sprintf("id-%d", i)
		res, err := db.Exec(`INSERT INTO inputs (id, conversation_id, kind, subject, ts, payload, status, reason, received_at, payload_hash, payload_size)
			VALUES (?, '', 'turn', ?, 1, x'00', 'rejected', 'bad_subject', 1, x'01', 1)`, id, subj)
		if err != nil {
			t.Fatal(err)
		}
		rowids[id], _ = res.LastInsertId()
	}
	db.Close()

	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i, subj := range subjects {
		id := fmt.Sprintf("id-%d", i)
		var tenant string
		var rowid int64
		if err := s.r.QueryRowContext(ctx, "SELECT tenant, rowid FROM inputs WHERE id = ?", id).Scan(&tenant, &rowid); err != nil {
			t.Fatalf("%s (%q): %v", id, subj, err)
		}
		if want := schema.SubjectTenant(subj); tenant != want {
			t.Errorf("%q: tenant %q, want %q (schema.SubjectTenant)", subj, tenant, want)
		}
		if rowid != rowids[id] {
			t.Errorf("%q: rowid %d, was %d", subj, rowid, rowids[id])
		}
	}
	var idx int
	if err := s.r.QueryRowContext(ctx, "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND name = 'inputs_rejected_payloads'").Scan(&idx); err != nil || idx != 1 {
		t.Fatalf("index inputs_rejected_payloads: %d, %v", idx, err)
	}
	// id-1 was acme's; globex and the service's own account may use it.
	for _, conv := range []string{"globex.c9", "c9"} {
		if res := commit(t, s, tenantTurn(conv, "id-1")); res[0].Duplicate {
			t.Fatalf("%s: id-1 is taken: %+v", conv, res[0])
		}
	}
	if res := commit(t, s, Entry{Input: InputRecord{ID: "id-1", ConversationID: "acme.c1", Kind: "turn",
		Subject: "ctx.in.acme.c1.turn", TS: 1, Payload: []byte("x"), Status: StatusRejected}}); !res[0].Duplicate {
		t.Fatalf("acme's own id-1 again: %+v, want a duplicate", res[0])
	}
}
