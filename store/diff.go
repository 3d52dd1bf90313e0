package store

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// maxDiffSamples bounds DiffTable.Samples: enough to start looking, small
// enough that a database where every row differs still prints a short report.
const maxDiffSamples = 5

// DiffTable is one table's comparison.
//
// A row counts as the same on both sides only when every column matches,
// storage class and bytes: a row whose key is on both sides but whose other
// columns differ counts once in OnlyA and once in OnlyB (as SELECT * EXCEPT
// SELECT * would count it), and its sample names the columns.
type DiffTable struct {
	Name         string
	RowsA, RowsB int
	OnlyA, OnlyB int
	// Samples are up to 5 human-readable differences, such as
	// "messages acme.c1/m2: body differs" or "inputs x: only in b". A table
	// missing on one side, or whose columns differ, has a sample saying so.
	Samples []string
}

// Identical reports whether the table holds the same rows on both sides.
// Every difference Diff finds leaves a sample, so a table missing on one
// side counts even when the other side's table is empty.
func (t DiffTable) Identical() bool {
	return t.OnlyA == 0 && t.OnlyB == 0 && t.RowsA == t.RowsB && len(t.Samples) == 0
}

// String is one line: "messages: 3 rows = 3 rows, identical", or the counts
// of rows only in a and only in b and the first sample.
func (t DiffTable) String() string {
	if t.Identical() {
		return fmt.Sprintf("%s: %d rows = %d rows, identical", t.Name, t.RowsA, t.RowsB)
	}
	s := fmt.Sprintf("%s: %d rows vs %d rows, %d only in a, %d only in b", t.Name, t.RowsA, t.RowsB, t.OnlyA, t.OnlyB)
	if len(t.Samples) > 0 {
		s += "; first: " + t.Samples[0]
	}
	return s
}

// DiffReport is the whole comparison, one entry per table in name order.
type DiffReport struct {
	Tables []DiffTable
}

// Identical reports whether every compared table is identical.
func (r DiffReport) Identical() bool {
	for _, t := range r.Tables {
		if !t.Identical() {
			return false
		}
	}
	return true
}

// String has one line per table (see DiffTable.String).
func (r DiffReport) String() string {
	lines := make([]string, len(r.Tables))
	for i, t := range r.Tables {
		lines[i] = t.String()
	}
	return strings.Join(lines, "\n")
}

// diffSkipped are the tables that describe one instance rather than the
// conversations: a database rebuilt from the changelog has its own outbox,
// relay cursor and migration history, so they are expected to differ.
var diffSkipped = map[string]bool{
	"outbox":            true,
	"relay_cursor":      true,
	"schema_version":    true,
	"schema_migrations": true,
}

// diffCompared reports whether Diff compares the table. Everything not known
// to be bookkeeping is compared, so a table added by a later migration is
// covered without anyone remembering to list it here.
func diffCompared(name string) bool {
	if diffSkipped[name] {
		return false
	}
	for _, p := range []string{"sqlite_", "changelog", "partition"} {
		if strings.HasPrefix(name, p) {
			return false
		}
	}
	return true
}

// Diff compares the databases at pathA and pathB table by table, every
// column of every row, and reports where they differ. It compares every
// table of either file except per-instance bookkeeping (outbox,
// relay_cursor, schema_version, and tables named changelog* or partition*);
// a table present on one side only is a difference.
//
// Both files are opened read-only and each is read in one transaction, so
// either may be live under a running consumer: Diff sees one committed
// snapshot of it. The files are never written; SQLite may create the -shm
// and an empty -wal next to a WAL-mode file, as any reader does.
//
// Values are compared as SQLite stores them: the storage class (integer,
// real, text, blob, null) and then the exact bytes, or bits for a real. Both
// sides are streamed in primary key order and merged, so memory does not
// grow with the table; a rebuilt database, whose pages are laid out
// differently, still compares equal when it holds the same rows.
func Diff(ctx context.Context, pathA, pathB string) (DiffReport, error) {
	a, err := openDiffSide(ctx, pathA)
	if err != nil {
		return DiffReport{}, fmt.Errorf("diff: a: %w", err)
	}
	defer a.close()
	b, err := openDiffSide(ctx, pathB)
	if err != nil {
		return DiffReport{}, fmt.Errorf("diff: b: %w", err)
	}
	defer b.close()

	tablesA, err := a.tables(ctx)
	if err != nil {
		return DiffReport{}, fmt.Errorf("diff: a: %w", err)
	}
	tablesB, err := b.tables(ctx)
	if err != nil {
		return DiffReport{}, fmt.Errorf("diff: b: %w", err)
	}
	names := slices.Concat(tablesA, tablesB)
	slices.Sort(names)
	names = slices.Compact(names)

	var r DiffReport
	for _, name := range names {
		inA, inB := slices.Contains(tablesA, name), slices.Contains(tablesB, name)
		var t DiffTable
		switch {
		case inA && inB:
			t, err = diffTable(ctx, a, b, name)
		case inA:
			t, err = diffMissing(ctx, a, name, "b")
		default:
			t, err = diffMissing(ctx, b, name, "a")
			t.RowsA, t.RowsB, t.OnlyA, t.OnlyB = t.RowsB, t.RowsA, t.OnlyB, t.OnlyA
		}
		if err != nil {
			return DiffReport{}, fmt.Errorf("diff: %w", err)
		}
		r.Tables = append(r.Tables, t)
	}
	return r, nil
}

// diffSide is one database, held at one snapshot by an open read
// transaction.
func diffMissing(ctx context.Context, s *diffSide, table, other string) (DiffTable, error) {
	n, err := s.count(ctx, table)
	if err != nil {
		return DiffTable{}, err
	}
	return DiffTable{Name: table, RowsA: n, OnlyA: n, Samples: []string{table + ": table missing in " + other}}, nil
}

// diffTable compares one table present on both sides.
func diffTable(ctx context.Context, a, b *diffSide, table string) (DiffTable, error) {
	ca, err := a.columns(ctx, table)
	if err != nil {
		return DiffTable{}, err
	}
	cb, err := b.columns(ctx, table)
	if err != nil {
		return DiffTable{}, err
	}
	t := DiffTable{Name: table}
	if why := shapeDiff(ca, cb); why != "" {
		// No row can be the same when the columns are not: every row of
		// each side counts as only there.
		if t.RowsA, err = a.count(ctx, table); err != nil {
			return DiffTable{}, err
		}
		if t.RowsB, err = b.count(ctx, table); err != nil {
			return DiffTable{}, err
		}
		t.OnlyA, t.OnlyB = t.RowsA, t.RowsB
		t.Samples = []string{table + ": " + why}
		return t, nil
	}

	// A table without a primary key is ordered, and its rows matched, by
	// every column: equal rows then pair up one for one.
	key := ca.key
	if len(key) == 0 {
		key = ca.names
	}
	keyIdx := make([]int, len(key))
	for i, k := range key {
		keyIdx[i] = slices.Index(ca.names, k)
	}
	q := diffQuery(table, ca.names, key)
	ra, err := newDiffCursor(ctx, a, table, q, len(ca.names), keyIdx)
	if err != nil {
		return DiffTable{}, err
	}
	defer ra.rows.Close()
	rb, err := newDiffCursor(ctx, b, table, q, len(ca.names), keyIdx)
	if err != nil {
		return DiffTable{}, err
	}
	defer rb.rows.Close()

	sample := func(s string) {
		if len(t.Samples) < maxDiffSamples {
			t.Samples = append(t.Samples, s)
		}
	}
	for ra.ok || rb.ok {
		var c int
		switch {
		case !rb.ok:
			c = -1
		case !ra.ok:
			c = 1
		default:
			c = compareKeys(ra.row, rb.row, keyIdx)
		}
		switch {
		case c < 0:
			t.OnlyA++
			sample(table + " " + formatKey(ra.row, keyIdx) + ": only in a")
			err = ra.next()
		case c > 0:
			t.OnlyB++
			sample(table + " " + formatKey(rb.row, keyIdx) + ": only in b")
			err = rb.next()
		default:
			if d := rowDiff(ca.names, ra.row, rb.row); d != "" {
				t.OnlyA++
				t.OnlyB++
				sample(table + " " + formatKey(ra.row, keyIdx) + ": " + d)
			}
			if err = ra.next(); err == nil {
				err = rb.next()
			}
		}
		if err != nil {
			return DiffTable{}, err
		}
	}
	t.RowsA, t.RowsB = ra.n, rb.n
	return t, nil
}

// shapeDiff says how two tables' columns differ, or "" when they have the
// same columns (in any order) and the same primary key.
func shapeDiff(a, b diffColumns) string {
	var why []string
	for _, n := range a.names {
		if !slices.Contains(b.names, n) {
			why = append(why, "column "+n+" only in a")
		}
	}
	for _, n := range b.names {
		if !slices.Contains(a.names, n) {
			why = append(why, "column "+n+" only in b")
		}
	}
	if !slices.Equal(a.key, b.key) {
		why = append(why, fmt.Sprintf("primary key (%s) in a, (%s) in b", strings.Join(a.key, ", "), strings.Join(b.key, ", ")))
	}
	return strings.Join(why, "; ")
}

// diffQuery selects every column of table in key order. Each column is
// selected as +column, which SQLite evaluates to the stored value unchanged
// but without the declared type: go-sqlite3 would otherwise turn a column
// declared DATETIME or BOOLEAN into a time.Time or a bool, losing the
// stored bytes. The order is by the table's own columns in binary collation,
// which the primary key index serves without a sort, and which compareKeys
