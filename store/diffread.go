package store

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

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
