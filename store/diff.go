package store

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"encoding/hex"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
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
type diffSide struct {
	path string
	db   *sql.DB
	tx   *sql.Tx
}

func openDiffSide(ctx context.Context, path string) (*diffSide, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	// mode=ro cannot create a file, but it fails only at the first query and
	// with a vaguer message; an empty path or a directory would be opened
	// as an empty database and compare as one.
	if fi, err := os.Stat(abs); err != nil {
		return nil, fmt.Errorf("open %s: %w", abs, err)
	} else if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("open %s: not a regular file", abs)
	}
	db, err := sql.Open("sqlite3", dsn(abs, "mode=ro&_busy_timeout=5000"))
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", abs, err)
	}
	// One connection: every query must run inside the one transaction, and
	// the merge reads one table at a time.
	db.SetMaxOpenConns(1)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("open %s: begin: %w", abs, err)
	}
	return &diffSide{path: abs, db: db, tx: tx}, nil
}

func (s *diffSide) close() {
	s.tx.Rollback() // read only: nothing to lose
	s.db.Close()
}

// tables lists the compared tables, sorted by name.
func (s *diffSide) tables(ctx context.Context) ([]string, error) {
	rows, err := s.tx.QueryContext(ctx, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
	if err != nil {
		return nil, fmt.Errorf("list tables of %s: %w", s.path, err)
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, fmt.Errorf("list tables of %s: %w", s.path, err)
		}
		if diffCompared(n) {
			names = append(names, n)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list tables of %s: %w", s.path, err)
	}
	return names, nil
}

// diffColumns is a table's shape: its columns in declaration order and its
// primary key columns in key order.
type diffColumns struct {
	names []string
	key   []string
}

func (s *diffSide) columns(ctx context.Context, table string) (diffColumns, error) {
	rows, err := s.tx.QueryContext(ctx, "SELECT name, pk FROM pragma_table_info(?) ORDER BY cid", table)
	if err != nil {
		return diffColumns{}, fmt.Errorf("columns of %s in %s: %w", table, s.path, err)
	}
	defer rows.Close()
	var c diffColumns
	var pks []int
	for rows.Next() {
		var name string
		var pk int
		if err := rows.Scan(&name, &pk); err != nil {
			return diffColumns{}, fmt.Errorf("columns of %s in %s: %w", table, s.path, err)
		}
		c.names = append(c.names, name)
		pks = append(pks, pk)
	}
	if err := rows.Err(); err != nil {
		return diffColumns{}, fmt.Errorf("columns of %s in %s: %w", table, s.path, err)
	}
	if len(c.names) == 0 {
		return diffColumns{}, fmt.Errorf("columns of %s in %s: none", table, s.path)
	}
	for want := 1; ; want++ {
		i := slices.Index(pks, want)
		if i < 0 {
			break
		}
		c.key = append(c.key, c.names[i])
	}
	return c, nil
}

func (s *diffSide) count(ctx context.Context, table string) (int, error) {
	var n int
	if err := s.tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+quoteIdent(table)).Scan(&n); err != nil {
		return 0, fmt.Errorf("count %s in %s: %w", table, s.path, err)
	}
	return n, nil
}

// diffMissing reports a table that side s has and the other side (named
// other) lacks: all its rows are only on s's side. The result is written as
// if s were a; the caller swaps it when s is b.
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
// reproduces.
func diffQuery(table string, cols, key []string) string {
	sel := make([]string, len(cols))
	for i, c := range cols {
		sel[i] = "+" + quoteIdent(c)
	}
	order := make([]string, len(key))
	for i, k := range key {
		order[i] = quoteIdent(table) + "." + quoteIdent(k) + " COLLATE BINARY"
	}
	return "SELECT " + strings.Join(sel, ", ") + " FROM " + quoteIdent(table) + " ORDER BY " + strings.Join(order, ", ")
}

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// diffCursor walks one side's rows. It keeps two row buffers: the current
// row and the one before it, to check the order.
type diffCursor struct {
	side   *diffSide
	table  string
	rows   *sql.Rows
	keyIdx []int
	bufs   [2][]any
	ptrs   [2][]any
	cur    int
	row    []any // the current row; valid while ok
	ok     bool
	n      int // rows read so far
}

func newDiffCursor(ctx context.Context, s *diffSide, table, q string, ncols int, keyIdx []int) (*diffCursor, error) {
	rows, err := s.tx.QueryContext(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("read %s in %s: %w", table, s.path, err)
	}
	c := &diffCursor{side: s, table: table, rows: rows, keyIdx: keyIdx}
	for i := range c.bufs {
		c.bufs[i] = make([]any, ncols)
		c.ptrs[i] = make([]any, ncols)
		for j := range c.bufs[i] {
			c.ptrs[i][j] = &c.bufs[i][j]
		}
	}
	if err := c.next(); err != nil {
		rows.Close()
		return nil, err
	}
	return c, nil
}

// next reads the following row. A row that sorts before the previous one
// means compareKeys and SQLite disagree on the order; the merge would then
// report rows as missing that are not, so it is an error rather than a
// wrong report.
func (c *diffCursor) next() error {
	if !c.rows.Next() {
		c.ok, c.row = false, nil
		if err := c.rows.Err(); err != nil {
			return fmt.Errorf("read %s in %s: %w", c.table, c.side.path, err)
		}
		return nil
	}
	prev := c.row
	c.cur ^= 1
	// database/sql copies a []byte into an *any destination, so the buffer
	// does not alias driver memory that the next row reuses.
	if err := c.rows.Scan(c.ptrs[c.cur]...); err != nil {
		return fmt.Errorf("read %s in %s: %w", c.table, c.side.path, err)
	}
	c.row, c.ok = c.bufs[c.cur], true
	c.n++
	for _, v := range c.row {
		if storageRank(v) < 0 {
			return fmt.Errorf("read %s in %s: value of unexpected type %T", c.table, c.side.path, v)
		}
	}
	if prev != nil && compareKeys(prev, c.row, c.keyIdx) > 0 {
		return fmt.Errorf("read %s in %s: row %s came after %s: SQLite's key order is not the one Diff merges by",
			c.table, c.side.path, formatKey(c.row, c.keyIdx), formatKey(prev, c.keyIdx))
	}
	return nil
}

// storageRank is the value's place in SQLite's sort order of storage
// classes: NULL, then numbers (integer and real together), text, blob. It is
// -1 for a type go-sqlite3 does not return for an expression column.
func storageRank(v any) int {
	switch v.(type) {
	case nil:
		return 0
	case int64, float64:
		return 1
	case string:
		return 2
	case []byte:
		return 3
	}
	return -1
}

// compareValues orders two values as SQLite's ORDER BY ... COLLATE BINARY
// does.
func compareValues(x, y any) int {
	if rx, ry := storageRank(x), storageRank(y); rx != ry {
		return cmp.Compare(rx, ry)
	}
	switch x := x.(type) {
	case int64:
		switch y := y.(type) {
		case int64:
			return cmp.Compare(x, y)
		case float64:
			return compareIntFloat(x, y)
		}
	case float64:
		switch y := y.(type) {
		case int64:
			return -compareIntFloat(y, x)
		case float64:
			return cmp.Compare(x, y)
		}
	case string:
		return strings.Compare(x, y.(string))
	case []byte:
		return bytes.Compare(x, y.([]byte))
	}
	return 0 // both NULL
}

// compareIntFloat compares an integer with a real exactly, as SQLite does:
// converting i to float64 would round integers above 2^53.
func compareIntFloat(i int64, f float64) int {
	switch {
	case f < math.MinInt64:
		return 1
	case f >= math.MaxInt64: // 2^63: MaxInt64 rounds up to it
		return -1
	}
	if t := int64(f); i != t {
		return cmp.Compare(i, t)
	}
	// i is f's integer part: f's fraction decides.
	return cmp.Compare(0, f-math.Trunc(f))
}

func compareKeys(x, y []any, keyIdx []int) int {
	for _, i := range keyIdx {
		if c := compareValues(x[i], y[i]); c != 0 {
			return c
		}
	}
	return 0
}

// sameValue reports whether two stored values are the same: same storage
// class, same bytes (same bits for a real, so a difference in the last bit
// shows; SQLite never stores a NaN).
func sameValue(x, y any) bool {
	switch x := x.(type) {
	case nil:
		return y == nil
	case int64:
		y, ok := y.(int64)
		return ok && x == y
	case float64:
		y, ok := y.(float64)
		return ok && math.Float64bits(x) == math.Float64bits(y)
	case string:
		y, ok := y.(string)
		return ok && x == y
	case []byte:
		y, ok := y.([]byte)
		return ok && bytes.Equal(x, y)
	}
	return false
}

// rowDiff names the columns in which two rows with the same key differ, or
// is "" when they do not. When only one column differs and both values are
// short, it shows them, so a one-bit difference in a real is visible.
func rowDiff(cols []string, x, y []any) string {
	var diff []int
	for i := range cols {
		if !sameValue(x[i], y[i]) {
			diff = append(diff, i)
		}
	}
	switch len(diff) {
	case 0:
		return ""
	case 1:
		i := diff[0]
		s := cols[i] + " differs"
		vx, okx := shortValue(x[i])
		vy, oky := shortValue(y[i])
		if okx && oky {
			s += fmt.Sprintf(" (a %s, b %s)", vx, vy)
		} else if typeName(x[i]) != typeName(y[i]) {
			s += fmt.Sprintf(" (a %s, b %s)", typeName(x[i]), typeName(y[i]))
		}
		return s
	}
	names := make([]string, len(diff))
	for i, d := range diff {
		names[i] = cols[d]
	}
	return strings.Join(names, ", ") + " differ"
}

func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case int64:
		return "integer"
	case float64:
		return "real"
	case string:
		return "text"
	case []byte:
		return "blob"
	}
	return fmt.Sprintf("%T", v)
}

// shortValue renders a number, NULL or short text for a sample; a real
// always shows as one (1.0, not 1) and exactly (shortest round trip).
func shortValue(v any) (string, bool) {
	switch v := v.(type) {
	case nil:
		return "NULL", true
	case int64:
		return strconv.FormatInt(v, 10), true
	case float64:
		s := strconv.FormatFloat(v, 'g', -1, 64)
		if !strings.ContainsAny(s, ".eIN") {
			s += ".0"
		}
		return s, true
	case string:
		if len(v) <= 40 {
			return strconv.Quote(v), true
		}
	}
	return "", false
}

// formatKey renders a row's key for a sample: its values joined by "/",
// text as is (ids and conversation keys), long values cut.
func formatKey(row []any, keyIdx []int) string {
	parts := make([]string, len(keyIdx))
	for i, k := range keyIdx {
		switch v := row[k].(type) {
		case string:
			parts[i] = cut(v, 80)
		case []byte:
			parts[i] = "x'" + cut(hex.EncodeToString(v), 80) + "'"
		default:
			parts[i], _ = shortValue(v)
		}
	}
	return strings.Join(parts, "/")
}

// cut shortens s to at most n bytes, on a rune boundary, marking the cut.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
