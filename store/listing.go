package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"

	"github.com/ctxpipe/ctxpipe/schema"
)

// Reads over every conversation at once: each with its state, last change
// and message counts, and a cheap mark that moves whenever any input is
// stored, so a reader that polls can tell when to read again without
// re-reading every conversation.

// ConversationInfo is one stored conversation as ConversationInfos lists it.
type ConversationInfo struct {
	Key       string // the conversation key, <tenant>.<conv> or <conv>
	State     schema.ConversationState
	UpdatedAt int64 // Unix ms of the commit that last changed its state
	Stored    int   // messages stored, hidden ones included
	Hidden    int   // of which a summary or marker hides
}

// ConversationInfos lists every conversation with its state, last change
// and message counts, in key order, from one read snapshot.
func (s *Store) ConversationInfos(ctx context.Context) ([]ConversationInfo, error) {
	// The hidden count is the same rule as HiddenCount, grouped: each
	// message's summary or marker is found through the partial indexes of
	// migration 0002.
	return queryRows(ctx, s.r, "conversation infos", func(rows *sql.Rows) (ConversationInfo, error) {
		var ci ConversationInfo
		var raw []byte
		if err := rows.Scan(&ci.Key, &raw, &ci.UpdatedAt, &ci.Stored, &ci.Hidden); err != nil {
			return ci, err
		}
		if err := json.Unmarshal(raw, &ci.State); err != nil {
			return ci, fmt.Errorf("state of %s: %w", ci.Key, err)
		}
		return ci, nil
	}, `SELECT c.id, c.state, c.updated_at,
		(SELECT COUNT(*) FROM messages m WHERE m.conversation_id = c.id),
		(SELECT COUNT(*) FROM messages m WHERE m.conversation_id = c.id AND (
			(m.condense_parent != '' AND EXISTS (SELECT 1 FROM messages s WHERE s.conversation_id = c.id
				AND s.is_summary = 1 AND s.condense_id = m.condense_parent))
			OR (m.truncation_parent != '' AND EXISTS (SELECT 1 FROM messages k WHERE k.conversation_id = c.id
				AND k.is_truncation_marker = 1 AND k.truncation_id = m.truncation_parent))))
		FROM conversations c ORDER BY c.id`)
}

// UpdatedAt is when conversation key's state last changed (Unix ms);
// found is false when none is stored.
func (s *Store) UpdatedAt(ctx context.Context, key string) (at int64, found bool, err error) {
	rows, err := s.r.QueryContext(ctx, "SELECT updated_at FROM conversations WHERE id = ?", key)
	if err != nil {
		return 0, false, fmt.Errorf("updated_at of %s: %w", key, err)
	}
	defer rows.Close()
	if rows.Next() {
		if err := rows.Scan(&at); err != nil {
			return 0, false, fmt.Errorf("updated_at of %s: %w", key, err)
		}
		found = true
	}
	return at, found, rows.Err()
}

// InputMark moves whenever an input is stored (applied or rejected), in any
// conversation: the largest rowid of the inputs table, which only grows
// (inputs are never deleted, only a rejected one's payload is cleared).
// Reading it costs one step down the table's b-tree.
func (s *Store) InputMark(ctx context.Context) (int64, error) {
	var n int64
	if err := s.r.QueryRowContext(ctx, "SELECT COALESCE(MAX(rowid), 0) FROM inputs").Scan(&n); err != nil {
		return 0, fmt.Errorf("input mark: %w", err)
	}
	return n, nil
}

// Conversations lists the ids of the conversations that have a stored state,
// in id order.
func (s *Store) Conversations(ctx context.Context) ([]string, error) {
	return queryRows(ctx, s.r, "conversations", func(rows *sql.Rows) (id string, err error) {
		err = rows.Scan(&id)
		return id, err
	}, "SELECT id FROM conversations ORDER BY id")
}

// ConversationCount is the number of conversations with a stored state.
func (s *Store) ConversationCount(ctx context.Context) (int, error) {
	var n int
	if err := s.r.QueryRowContext(ctx, "SELECT COUNT(*) FROM conversations").Scan(&n); err != nil {
		return 0, fmt.Errorf("conversation count: %w", err)
	}
	return n, nil
}
