package store

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ctxpipe/ctxpipe/schema"
)

// diffTables are the tables Diff must compare in a ctxpipe database: the
// outbox, relay cursor and schema_version are per-instance bookkeeping.
var diffTables = []string{"conversations", "events", "history_seq", "inputs", "messages"}

// diffFixture is a closed ctxpipe database holding two conversations, a
// condense (summary, parent tags, its event) and a rejected input, stored
// through Commit like the consumer stores them.
func diffFixture(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "a.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	const conv = "acme.c1"
	commit(t, s, turnEntry(conv, msg(conv, "m1", 1, schema.RoleUser, "hello"),
		msg(conv, "m2", 2, schema.RoleAssistant, "hi there"), msg(conv, "m3", 3, schema.RoleUser, "bye")))

	summary := msg(conv, "sum", 4, schema.RoleAssistant, "summary")
	summary.IsSummary, summary.CondenseID = true, "cond-1"
	e := turnEntry(conv)
	e.Changes.Insert = []schema.Insertion{{Message: summary, Before: "m3"}}
	e.Changes.Tags = []schema.TagChange{
		{MessageID: "m1", Field: schema.TagCondenseParent, Value: "cond-1"},
		{MessageID: "m2", Field: schema.TagCondenseParent, Value: "cond-1"},
	}
	e.Changes.Events = []schema.Event{&schema.CondenseContext{
		EventHeader: schema.EventHeader{ID: "ev-1", Type: schema.EventCondenseContext, ConversationID: conv, TS: 5, InputID: e.Input.ID},
		CondenseID:  "cond-1", Summary: "summary", Cost: 0.1, Trigger: schema.TriggerAuto,
	}}
	commit(t, s, e)

	commit(t, s, turnEntry("acme.c2", msg("acme.c2", "m1", 1, schema.RoleUser, "other")))
	rej := input(conv, schema.KindTurn)
	rej.Payload, rej.Status, rej.Reason = []byte(`{`), StatusRejected, string(schema.ReasonInvalidJSON)
	commit(t, s, Entry{Input: rej})
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	return path
}

// copyDB copies a closed database (its WAL checkpointed away by the close).
func copyDB(t *testing.T, src string) string {
	t.Helper()
	if fi, err := os.Stat(src + "-wal"); err == nil && fi.Size() > 0 {
		t.Fatalf("%s has a non-empty WAL; close it first", src)
	}
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "b.db")
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dst
}

// rawDB opens a database with no ctxpipe machinery, to change it behind the
// store's back.
func rawDB(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite3", dsn(path, "_busy_timeout=5000"))
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// exec1 runs a statement that must change exactly one row.
func exec1(t *testing.T, db *sql.DB, q string, args ...any) {
	t.Helper()
	res, err := db.Exec(q, args...)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		t.Fatalf("%s: changed %d rows (%v), want 1", q, n, err)
	}
}

// dbFiles is what Diff must leave alone: the database file and its WAL (an
// absent WAL and an empty one are the same content).
func dbFiles(t *testing.T, path string) [2][]byte {
	t.Helper()
	db, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	wal, err := os.ReadFile(path + "-wal")
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	return [2][]byte{db, wal}
}

func tableOf(t *testing.T, r DiffReport, name string) DiffTable {
	t.Helper()
	for _, tb := range r.Tables {
		if tb.Name == name {
			return tb
		}
	}
	t.Fatalf("no table %s in the report:\n%s", name, r)
	return DiffTable{}
}

func TestDiff(t *testing.T) {
	base := diffFixture(t)
	tests := []struct {
		name   string
		change func(t *testing.T, db *sql.DB) // applied to a copy, b
		// The one table that must differ ("" for none), how, and a
		// sample it must carry.
		table        string
		onlyA, onlyB int
		sample       string
	}{
		{name: "identical copies"},
		{name: "message body changed", table: "messages", onlyA: 1, onlyB: 1,
			sample: "messages acme.c1/m2: body differs",
			change: func(t *testing.T, db *sql.DB) {
				// Same length, one byte changed: only the bytes can tell.
				exec1(t, db, `UPDATE messages SET body = CAST(replace(CAST(body AS TEXT), 'hi there', 'hi thEre') AS BLOB)
					WHERE conversation_id = 'acme.c1' AND id = 'm2'`)
			}},
		{name: "condense_parent tag changed", table: "messages", onlyA: 1, onlyB: 1,
			sample: `messages acme.c1/m1: condense_parent differs (a "cond-1", b "")`,
			change: func(t *testing.T, db *sql.DB) {
				exec1(t, db, "UPDATE messages SET condense_parent = '' WHERE conversation_id = 'acme.c1' AND id = 'm1'")
			}},
		{name: "pos one ulp apart", table: "messages", onlyA: 1, onlyB: 1,
			sample: "messages acme.c1/sum: pos differs (a 2.5, b 2.5000000000000004)",
			change: func(t *testing.T, db *sql.DB) {
				var pos float64
				if err := db.QueryRow("SELECT pos FROM messages WHERE conversation_id = 'acme.c1' AND id = 'sum'").Scan(&pos); err != nil {
					t.Fatal(err)
				}
				if pos != 2.5 {
					t.Fatalf("summary pos = %v; the fixture changed, fix the sample", pos)
				}
				exec1(t, db, "UPDATE messages SET pos = ? WHERE conversation_id = 'acme.c1' AND id = 'sum'", math.Nextafter(pos, math.Inf(1)))
			}},
		{name: "extra input in b", table: "inputs", onlyB: 1, sample: "inputs acme/extra: only in b",
			change: func(t *testing.T, db *sql.DB) {
				exec1(t, db, `INSERT INTO inputs (tenant, id, conversation_id, kind, subject, ts, payload, status, received_at)
					VALUES ('acme', 'extra', 'acme.c1', 'turn', 'ctx.in.acme.c1.turn', 1, x'7b7d', 'applied', 1)`)
			}},
		{name: "input missing from b", table: "inputs", onlyA: 1, sample: ": only in a",
			change: func(t *testing.T, db *sql.DB) {
				exec1(t, db, "DELETE FROM inputs WHERE status = 'rejected'")
			}},
		{name: "state stored as text instead of blob", table: "conversations", onlyA: 1, onlyB: 1,
			sample: "conversations acme.c2: state differs (a blob, b text)",
			change: func(t *testing.T, db *sql.DB) {
				// The same bytes in another storage class: not the same value.
				exec1(t, db, "UPDATE conversations SET state = CAST(state AS TEXT) WHERE id = 'acme.c2' AND typeof(state) = 'blob'")
			}},
		{name: "table missing in b", table: "history_seq", onlyA: 2, sample: "history_seq: table missing in b",
			change: func(t *testing.T, db *sql.DB) {
				if _, err := db.Exec("DROP TABLE history_seq"); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "bookkeeping differs, data does not",
			change: func(t *testing.T, db *sql.DB) {
				for _, q := range []string{
					"UPDATE outbox SET published_at = 1",
					"INSERT INTO relay_cursor (id, stream_seq) VALUES (1, 7)",
					"UPDATE schema_version SET applied_at = 0",
					// Names no migration uses: the prefix alone must exclude them.
					"CREATE TABLE changelog_diff_probe (seq INTEGER)",
					"INSERT INTO changelog_diff_probe VALUES (1)",
					"CREATE TABLE partition_diff_probe (p INTEGER PRIMARY KEY)",
				} {
					if _, err := db.Exec(q); err != nil {
						t.Fatalf("%s: %v", q, err)
					}
				}
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pathB := copyDB(t, base)
			if tc.change != nil {
				db := rawDB(t, pathB)
				tc.change(t, db)
				if err := db.Close(); err != nil {
					t.Fatal(err)
				}
			}
			beforeA, beforeB := dbFiles(t, base), dbFiles(t, pathB)

			r, err := Diff(context.Background(), base, pathB)
			if err != nil {
				t.Fatalf("Diff: %v", err)
			}
			if got := r.Identical(); got != (tc.table == "") {
				t.Errorf("Identical() = %v, want %v:\n%s", got, tc.table == "", r)
			}
			var names []string
			for _, tb := range r.Tables {
				names = append(names, tb.Name)
			}
			if !slices.Equal(names, diffTables) {
				t.Errorf("tables compared = %v, want %v", names, diffTables)
			}
			lines := strings.Split(r.String(), "\n")
			if len(lines) != len(r.Tables) {
				t.Errorf("String has %d lines for %d tables:\n%s", len(lines), len(r.Tables), r)
			}
			for i, tb := range r.Tables {
				if tb.Name != tc.table {
					if !tb.Identical() || tb.RowsA == 0 {
						t.Errorf("%s: want identical and not empty, got %+v", tb.Name, tb)
					}
					if want := ", identical"; !strings.HasSuffix(lines[i], want) {
						t.Errorf("line %q does not end in %q", lines[i], want)
					}
					continue
				}
				if tb.Identical() || tb.OnlyA != tc.onlyA || tb.OnlyB != tc.onlyB {
					t.Errorf("%s: only in a %d, only in b %d (identical %v); want %d, %d", tb.Name, tb.OnlyA, tb.OnlyB, tb.Identical(), tc.onlyA, tc.onlyB)
				}
				if tb.RowsA-tb.OnlyA != tb.RowsB-tb.OnlyB {
					t.Errorf("%s: %d rows - %d only in a != %d rows - %d only in b", tb.Name, tb.RowsA, tb.OnlyA, tb.RowsB, tb.OnlyB)
				}
				if !slices.ContainsFunc(tb.Samples, func(s string) bool { return strings.Contains(s, tc.sample) }) {
					t.Errorf("%s: samples %q, want one containing %q", tb.Name, tb.Samples, tc.sample)
				}
				if !strings.Contains(lines[i], "only in b; first: ") {
					t.Errorf("line %q: want the counts and the first sample", lines[i])
				}
			}

			// Diff reads only: neither file changed, not even by a checkpoint.
			if afterA, afterB := dbFiles(t, base), dbFiles(t, pathB); !bytes.Equal(afterA[0], beforeA[0]) ||
				!bytes.Equal(afterA[1], beforeA[1]) || !bytes.Equal(afterB[0], beforeB[0]) || !bytes.Equal(afterB[1], beforeB[1]) {
				t.Errorf("Diff changed a database file")
			}

			// The other way round, every count changes sides.
			rev, err := Diff(context.Background(), pathB, base)
			if err != nil {
				t.Fatalf("Diff reversed: %v", err)
			}
			for i, tb := range rev.Tables {
				fw := r.Tables[i]
				if tb.Name != fw.Name || tb.RowsA != fw.RowsB || tb.RowsB != fw.RowsA || tb.OnlyA != fw.OnlyB || tb.OnlyB != fw.OnlyA {
					t.Errorf("reversed %+v does not mirror %+v", tb, fw)
				}
			}
		})
	}
}

// A database under a running consumer keeps its latest commits in the WAL:
// Diff must read them (through the shared memory index) and leave the WAL
// alone.
func TestDiffReadsLiveWAL(t *testing.T) {
	ctx := context.Background()
	base := diffFixture(t)
	pathB := copyDB(t, base)
	s, err := Open(ctx, pathB)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	commit(t, s, turnEntry("acme.c1", msg("acme.c1", "m9", 9, schema.RoleUser, "late")))
	before := dbFiles(t, pathB)
	if len(before[1]) == 0 {
		t.Fatal("the commit is not in the WAL; the test proves nothing")
	}

	r, err := Diff(ctx, base, pathB)
	if err != nil {
		t.Fatalf("Diff: %v", err)
	}
	if m := tableOf(t, r, "messages"); m.OnlyB != 1 || m.OnlyA != 0 || !slices.Contains(m.Samples, "messages acme.c1/m9: only in b") {
		t.Errorf("messages: %+v; want m9 only in b", m)
	}
	if after := dbFiles(t, pathB); !bytes.Equal(after[0], before[0]) || !bytes.Equal(after[1], before[1]) {
		t.Errorf("Diff changed the live database or its WAL")
	}
}

// The merge relies on reading each table in key order without a sort: a
// temporary B-tree would spill a million bodies to a temp file first.
func TestDiffScansInKeyOrder(t *testing.T) {
	ctx := context.Background()
	s, err := openDiffSide(ctx, diffFixture(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	for _, table := range diffTables {
		c, err := s.columns(ctx, table)
		if err != nil {
			t.Fatal(err)
		}
		if len(c.key) == 0 {
			t.Errorf("%s: no primary key found", table)
			continue
		}
		rows, err := s.tx.Query("EXPLAIN QUERY PLAN " + diffQuery(table, c.names, c.key))
		if err != nil {
			t.Fatalf("%s: %v", table, err)
		}
		var plan []string
		for rows.Next() {
			var id, parent, notused int
			var detail string
			if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		rows.Close()
		if p := strings.Join(plan, "; "); strings.Contains(p, "TEMP B-TREE") {
			t.Errorf("%s: query sorts (%s)", table, p)
		}
	}
}

// compareValues must agree with SQLite's own ORDER BY, across storage
// classes and integers too large for a float64.
func TestDiffValueOrderMatchesSQLite(t *testing.T) {
	db, err := sql.Open("sqlite3", ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TABLE v (x);
		INSERT INTO v VALUES (NULL), (1), (1.5), (-2.5), (-2), (9007199254740993), (9007199254740992.0),
			(-9223372036854775808), (9223372036854775807), (9.3e18), (-9.3e18), (0.0), ('b'), ('a'), ('B'), (''),
			('é'), (x'00'), (x''), (x'ff'), ('10'), (2)`); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Query("SELECT +x FROM v ORDER BY x COLLATE BINARY")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []any
	for rows.Next() {
		var v any
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		got = append(got, v)
	}
	for i := 1; i < len(got); i++ {
		if compareValues(got[i-1], got[i]) >= 0 {
			t.Errorf("SQLite orders %#v before %#v; compareValues disagrees", got[i-1], got[i])
		}
		if compareValues(got[i], got[i-1]) <= 0 {
			t.Errorf("compareValues(%#v, %#v) is not antisymmetric", got[i], got[i-1])
		}
	}
}

func TestDiffMissingFile(t *testing.T) {
	base := diffFixture(t)
	missing := filepath.Join(t.TempDir(), "nope.db")
	if _, err := Diff(context.Background(), base, missing); err == nil || !strings.Contains(err.Error(), "nope.db") {
		t.Errorf("Diff with a missing file: %v; want an error naming it", err)
	}
	if _, err := os.Stat(missing); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Diff created %s", missing)
	}
}
