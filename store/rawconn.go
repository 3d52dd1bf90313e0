package store

import (
	"bytes"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"math"

	sqlite3 "github.com/mattn/go-sqlite3"
)

// rawConn runs a bulk load's statements on the driver's connection,
// without database/sql: a rebuild runs tens of thousands of statements a
// second, each cheap for SQLite, so database/sql's per-call locking,
// argument checks and result wrapping are a share of the time worth
// skipping. Its arguments are those the committer passes: strings, byte
// slices, integers, floats, booleans and nil.
type rawConn struct {
	c     *sqlite3.SQLiteConn
	stmts map[string]driver.Stmt
	args  []driver.NamedValue
}

func (rc *rawConn) stmt(q string) (driver.Stmt, error) {
	if st, ok := rc.stmts[q]; ok {
		return st, nil
	}
	st, err := rc.c.Prepare(q)
	if err != nil {
		return nil, err
	}
	rc.stmts[q] = st
	return st, nil
}

func (rc *rawConn) bind(args []any) ([]driver.NamedValue, error) {
	rc.args = rc.args[:0]
	for i, a := range args {
		switch v := a.(type) {
		case int:
			a = int64(v)
		case uint64:
			if v > math.MaxInt64 {
				return nil, fmt.Errorf("argument %d: %d is out of range", i+1, v)
			}
			a = int64(v)
		case nil, string, []byte, int64, float64, bool:
		default:
			return nil, fmt.Errorf("argument %d: unsupported type %T", i+1, a)
		}
		rc.args = append(rc.args, driver.NamedValue{Ordinal: i + 1, Value: a})
	}
	return rc.args, nil
}

// prepared is q's statement with args bound.
func (rc *rawConn) prepared(q string, args []any) (driver.Stmt, []driver.NamedValue, error) {
	st, err := rc.stmt(q)
	if err != nil {
		return nil, nil, err
	}
	nv, err := rc.bind(args)
	return st, nv, err
}

func (rc *rawConn) exec(ctx context.Context, q string, args []any) (sql.Result, error) {
	st, nv, err := rc.prepared(q, args)
	if err != nil {
		return nil, err
	}
	return st.(driver.StmtExecContext).ExecContext(ctx, nv)
}

func (rc *rawConn) queryRow(ctx context.Context, q string, args []any) (row, error) {
	st, nv, err := rc.prepared(q, args)
	if err != nil {
		return nil, err
	}
	rows, err := st.(driver.StmtQueryContext).QueryContext(ctx, nv)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	r := rawRow{vals: make([]driver.Value, len(rows.Columns()))}
	if err := rows.Next(r.vals); err != nil {
		if !errors.Is(err, io.EOF) {
			return nil, err
		}
		r.vals = nil
	}
	return r, nil
}

// rawRow is a row read on the driver's connection (vals nil: no row).
type rawRow struct{ vals []driver.Value }

// Scan assigns the row's values to the kinds of destination the committer
// reads into.
func (r rawRow) Scan(dest ...any) error {
	if r.vals == nil {
		return sql.ErrNoRows
	}
	if len(dest) != len(r.vals) {
		return fmt.Errorf("scan: %d destinations for %d columns", len(dest), len(r.vals))
	}
	for i, v := range r.vals {
		ok := false
		switch d := dest[i].(type) {
		case *int64:
			*d, ok = v.(int64)
		case *float64:
			switch x := v.(type) {
			case float64:
				*d, ok = x, true
			case int64:
				*d, ok = float64(x), true
			}
		case *sql.NullFloat64:
			switch x := v.(type) {
			case nil:
				*d, ok = sql.NullFloat64{}, true
			case float64:
				*d, ok = sql.NullFloat64{Float64: x, Valid: true}, true
			case int64:
				*d, ok = sql.NullFloat64{Float64: float64(x), Valid: true}, true
			}
		case *string:
			switch x := v.(type) {
			case string:
				*d, ok = x, true
			case []byte:
				*d, ok = string(x), true
			}
		case *[]byte:
			switch x := v.(type) {
			case []byte:
				*d, ok = bytes.Clone(x), true
			case string:
				*d, ok = []byte(x), true
			case nil:
				*d, ok = nil, true
			}
		}
		if !ok {
			return fmt.Errorf("scan: column %d: cannot put %T into %T", i, v, dest[i])
		}
	}
	return nil
}
