package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// position picks the pos of a new message: after the last one when before is
// empty, else halfway between the message named before and its predecessor,
// so several messages inserted before the same one keep the order they were
// inserted in. When halving runs out of float precision the conversation is
// renumbered 1..n (same order) and the midpoint taken again.
func (c *committer) position(ctx context.Context, conv, before string) (float64, error) {
	if before == "" {
		last, ok := c.lastPos[conv]
		if !ok {
			row, err := c.queryRow(ctx, qLastPos, conv)
			if err == nil {
				err = row.Scan(&last)
			}
			if err != nil {
				return 0, fmt.Errorf("last position: %w", err)
			}
		}
		// Deletes drop it (see applyChanges); before-insertions stay
		// below it.
		c.lastPos[conv] = last + 1
		return last + 1, nil
	}
	for attempt := 0; ; attempt++ {
		var next float64
		row, err := c.queryRow(ctx, qPosOf, conv, before)
		if err == nil {
			err = row.Scan(&next)
		}
		if errors.Is(err, sql.ErrNoRows) {
			return 0, fmt.Errorf("before: message %s not found in conversation %s", before, conv)
		}
		if err != nil {
			return 0, fmt.Errorf("position of %s: %w", before, err)
		}
		var prev sql.NullFloat64
		row, err = c.queryRow(ctx, qPrevPos, conv, next)
		if err == nil {
			err = row.Scan(&prev)
		}
		if err != nil {
			return 0, fmt.Errorf("position before %s: %w", before, err)
		}
		lo := next - 1
		if prev.Valid {
			lo = prev.Float64
		}
		if mid := lo + (next-lo)/2; mid > lo && mid < next {
			return mid, nil
		}
		if attempt > 0 {
			return 0, fmt.Errorf("no room before %s at position %v", before, next)
		}
		if _, err := c.exec(ctx, qRenumber, conv); err != nil {
			return 0, fmt.Errorf("renumber positions: %w", err)
		}
		delete(c.lastPos, conv)
	}
}
