package store

import (
	"context"
	"fmt"

	"github.com/ctxpipe/ctxpipe/schema"
)

// ContextEvents returns the conversation's condense_context and
// sliding_window_truncation events as references, in ts order (commit order
// among equal ts).
func (s *Store) ContextEvents(ctx context.Context, conv string) ([]schema.ContextEventRef, error) {
	return contextEvents(ctx, s.r, conv)
}

func contextEvents(ctx context.Context, q querier, conv string) ([]schema.ContextEventRef, error) {
	rows, err := q.QueryContext(ctx, `SELECT type, ref_id, ts FROM events WHERE conversation_id = ? AND type IN (?, ?)
		ORDER BY ts, rowid`, conv, string(schema.EventCondenseContext), string(schema.EventSlidingWindowTruncation))
	if err != nil {
		return nil, fmt.Errorf("context events of %s: %w", conv, err)
	}
	defer rows.Close()
	var out []schema.ContextEventRef
	for rows.Next() {
		var r schema.ContextEventRef
		var typ string
		if err := rows.Scan(&typ, &r.ID, &r.TS); err != nil {
			return nil, fmt.Errorf("context events of %s: %w", conv, err)
		}
		r.Type = schema.EventType(typ)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("context events of %s: %w", conv, err)
	}
	return out, nil
}

// Events returns every event of a conversation in commit order.
func (s *Store) Events(ctx context.Context, conv string) ([]schema.Event, error) {
	rows, err := s.r.QueryContext(ctx, "SELECT id, body FROM events WHERE conversation_id = ? ORDER BY rowid", conv)
	if err != nil {
		return nil, fmt.Errorf("events of %s: %w", conv, err)
	}
	defer rows.Close()
	var out []schema.Event
	for rows.Next() {
		var id string
		var body []byte
		if err := rows.Scan(&id, &body); err != nil {
			return nil, fmt.Errorf("events of %s: %w", conv, err)
		}
		e, err := schema.DecodeEvent(body)
		if err != nil {
			return nil, fmt.Errorf("events of %s: event %s: %w", conv, id, err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("events of %s: %w", conv, err)
	}
	return out, nil
}

// EventBodies returns up to limit of a conversation's events as stored
// (their JSON), in commit order, skipping the first after; more says
// whether others follow.
func (s *Store) EventBodies(ctx context.Context, conv string, after, limit int) (bodies [][]byte, more bool, err error) {
	rows, err := s.r.QueryContext(ctx, "SELECT body FROM events WHERE conversation_id = ? ORDER BY rowid LIMIT ? OFFSET ?", conv, limit+1, after)
	if err != nil {
		return nil, false, fmt.Errorf("events of %s: %w", conv, err)
	}
	defer rows.Close()
	for rows.Next() {
		var body []byte
		if err := rows.Scan(&body); err != nil {
			return nil, false, fmt.Errorf("events of %s: %w", conv, err)
		}
		bodies = append(bodies, body)
	}
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("events of %s: %w", conv, err)
	}
	if len(bodies) > limit {
		return bodies[:limit], true, nil
	}
	return bodies, false, nil
}
