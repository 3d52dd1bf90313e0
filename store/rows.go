package store

import (
	"context"
	"database/sql"
	"fmt"
)

// queryRows runs q with args on db and reads every row with scan, in
// order (nil when there is none). Every error is wrapped with what, the
// name of the read.
func queryRows[T any](ctx context.Context, db *sql.DB, what string, scan func(*sql.Rows) (T, error), q string, args ...any) ([]T, error) {
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}
