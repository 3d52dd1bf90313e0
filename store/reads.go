package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/ctxpipe/ctxpipe/schema"
)

// All reads use the read-only pool. They still see every batch whose Commit
// has returned: a WAL reader takes its snapshot when its transaction starts,
// so the pipeline's lane gets read-your-writes without touching the writer.

// querier is what both *sql.DB and *sql.Tx offer.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Snapshot is one conversation read in a single read transaction.
type Snapshot struct {
	State         schema.ConversationState
	Found         bool // the conversation has a stored state
	Messages      []schema.Message
	ContextEvents []schema.ContextEventRef
}

// Load reads a conversation's state, full history and context events from one
// consistent snapshot.
func (s *Store) Load(ctx context.Context, conv string) (Snapshot, error) {
	var snap Snapshot
	tx, err := s.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return snap, fmt.Errorf("load %s: %w", conv, err)
	}
	defer tx.Rollback()
	if snap.State, snap.Found, err = state(ctx, tx, conv); err != nil {
		return snap, err
	}
	if snap.Messages, err = messages(ctx, tx, s.cache, conv); err != nil {
		return snap, err
	}
	if snap.ContextEvents, err = contextEvents(ctx, tx, conv); err != nil {
		return snap, err
	}
	return snap, nil
}

// State returns a conversation's state; found is false when none is stored.
func (s *Store) State(ctx context.Context, conv string) (schema.ConversationState, bool, error) {
	return state(ctx, s.r, conv)
}

func state(ctx context.Context, q querier, conv string) (schema.ConversationState, bool, error) {
	var st schema.ConversationState
	var raw []byte
	err := q.QueryRowContext(ctx, "SELECT state FROM conversations WHERE id = ?", conv).Scan(&raw)
	if errors.Is(err, sql.ErrNoRows) {
		return st, false, nil
	}
	if err != nil {
		return st, false, fmt.Errorf("state of %s: %w", conv, err)
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return st, false, fmt.Errorf("state of %s: decode: %w", conv, err)
	}
	return st, true, nil
}

// Messages returns a conversation's full history, hidden messages included,
// in position order, with every tag set.
//
// The messages share their content with the store's cache of decoded
// bodies: treat them as read-only (copy a Content before changing it).
func (s *Store) Messages(ctx context.Context, conv string) ([]schema.Message, error) {
	// The bodies the cache lacks are read by a second query: both read one
	// snapshot.
	tx, err := s.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("messages of %s: %w", conv, err)
	}
	defer tx.Rollback()
	return messages(ctx, tx, s.cache, conv)
}

// Visible returns the messages that no stored summary or marker hides, in
// position order: a superset of the effective history (the engine's
// EffectiveHistory over it gives the same result as over Messages) whose
// size is bounded by the context, not by the whole history, so a history
// query does not decode every message ever condensed away.
//
// bodies[i] is msgs[i] as stored: exactly its JSON (schema.Marshal) when it
// carries no parent tag, so a reply can send it without encoding it again.
func (s *Store) Visible(ctx context.Context, conv string) (msgs []schema.Message, bodies [][]byte, err error) {
	return queryMessagesRaw(ctx, s.r, s.cache, conv, `SELECT m.id, m.is_summary, m.condense_id, m.condense_parent, m.is_truncation_marker,
		m.truncation_id, m.truncation_parent, m.tokens, m.body FROM messages m WHERE m.conversation_id = ?1
		AND NOT (m.condense_parent != '' AND EXISTS (SELECT 1 FROM messages s INDEXED BY messages_summaries WHERE s.conversation_id = ?1
			AND s.is_summary = 1 AND s.condense_id = m.condense_parent))
		AND NOT (m.truncation_parent != '' AND EXISTS (SELECT 1 FROM messages k INDEXED BY messages_markers WHERE k.conversation_id = ?1
			AND k.is_truncation_marker = 1 AND k.truncation_id = m.truncation_parent))
		ORDER BY m.pos`)
}

// visibleFilter keeps the messages no stored summary or marker hides.
const visibleFilter = `
		AND NOT (m.condense_parent != '' AND EXISTS (SELECT 1 FROM messages s INDEXED BY messages_summaries WHERE s.conversation_id = ?1
			AND s.is_summary = 1 AND s.condense_id = m.condense_parent))
		AND NOT (m.truncation_parent != '' AND EXISTS (SELECT 1 FROM messages k INDEXED BY messages_markers WHERE k.conversation_id = ?1
			AND k.is_truncation_marker = 1 AND k.truncation_id = m.truncation_parent))`

// HiddenCount is how many stored messages a summary or marker hides.
func (s *Store) HiddenCount(ctx context.Context, conv string) (stored, hidden int, err error) {
	err = s.r.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(SUM(
		(m.condense_parent != '' AND EXISTS (SELECT 1 FROM messages s INDEXED BY messages_summaries WHERE s.conversation_id = ?1
			AND s.is_summary = 1 AND s.condense_id = m.condense_parent))
		OR (m.truncation_parent != '' AND EXISTS (SELECT 1 FROM messages k INDEXED BY messages_markers WHERE k.conversation_id = ?1
			AND k.is_truncation_marker = 1 AND k.truncation_id = m.truncation_parent))), 0)
		FROM messages m WHERE m.conversation_id = ?1`, conv).Scan(&stored, &hidden)
	if err != nil {
		return 0, 0, fmt.Errorf("hidden messages of %s: %w", conv, err)
	}
	return stored, hidden, nil
}

const allMessages = `SELECT id, is_summary, condense_id, condense_parent, is_truncation_marker,
		truncation_id, truncation_parent, tokens, body FROM messages WHERE conversation_id = ?1 ORDER BY pos`

// messageTags is allMessages without the bodies, which the cache mostly
// holds decoded already.
const messageTags = `SELECT id, is_summary, condense_id, condense_parent, is_truncation_marker,
		truncation_id, truncation_parent, tokens FROM messages WHERE conversation_id = ?1 ORDER BY pos`

// messages reads the tag columns of every message and only the bodies the
// cache does not hold, so reading a long history the pipeline appends to
// costs no copy and no decoding of bodies read before.
func messages(ctx context.Context, q querier, c *messageCache, conv string) ([]schema.Message, error) {
	if c == nil {
		return queryMessages(ctx, q, c, conv, allMessages)
	}
	rows, err := q.QueryContext(ctx, messageTags, conv)
	if err != nil {
		return nil, fmt.Errorf("messages of %s: %w", conv, err)
	}
	defer rows.Close()
	var (
		out    []schema.Message
		missed []int
	)
	for rows.Next() {
		var (
			id string
			t  schema.Message
		)
		if err := rows.Scan(&id, &t.IsSummary, &t.CondenseID, &t.CondenseParent, &t.IsTruncationMarker,
			&t.TruncationID, &t.TruncationParent, &t.Tokens); err != nil {
			return nil, fmt.Errorf("messages of %s: %w", conv, err)
		}
		m, ok := c.get(id)
		if !ok {
			m.ID = id
			missed = append(missed, len(out))
		}
		setTags(&m, &t)
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("messages of %s: %w", conv, err)
	}
	rows.Close()
	for len(missed) > 0 {
		n := min(len(missed), 500) // under SQLite's bound-parameter limit
		if err := fillBodies(ctx, q, c, conv, out, missed[:n]); err != nil {
			return nil, err
		}
		missed = missed[n:]
	}
	return out, nil
}

// fillBodies decodes the bodies of out[idx...], which hold only their ids
// and tags, and caches them.
func fillBodies(ctx context.Context, q querier, c *messageCache, conv string, out []schema.Message, idx []int) error {
	args := make([]any, 0, len(idx)+1)
	args = append(args, conv)
	at := make(map[string]int, len(idx))
	for _, i := range idx {
		args = append(args, out[i].ID)
		at[out[i].ID] = i
	}
	rows, err := q.QueryContext(ctx, "SELECT id, body FROM messages WHERE conversation_id = ? AND id IN (?"+
		strings.Repeat(",?", len(idx)-1)+")", args...)
	if err != nil {
		return fmt.Errorf("messages of %s: %w", conv, err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			id   string
			body []byte
			m    schema.Message
		)
		if err := rows.Scan(&id, &body); err != nil {
			return fmt.Errorf("messages of %s: %w", conv, err)
		}
		if err := schema.UnmarshalStored(body, &m); err != nil {
			return fmt.Errorf("messages of %s: decode %s: %w", conv, id, err)
		}
		c.put(id, m, len(body))
		i, ok := at[id]
		if !ok {
			continue
		}
		delete(at, id)
		setTags(&m, &out[i])
		out[i] = m
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("messages of %s: %w", conv, err)
	}
	if len(at) > 0 {
		return fmt.Errorf("messages of %s: %d bodies vanished while reading", conv, len(at))
	}
	return nil
}

// setTags copies the tag columns, the truth for the tags, from t to m.
func setTags(m, t *schema.Message) {
	m.IsSummary, m.CondenseID, m.CondenseParent = t.IsSummary, t.CondenseID, t.CondenseParent
	m.IsTruncationMarker, m.TruncationID, m.TruncationParent = t.IsTruncationMarker, t.TruncationID, t.TruncationParent
	m.Tokens = t.Tokens
}

// MessagesRaw is Messages with each message's stored body, as Visible gives them.
func (s *Store) MessagesRaw(ctx context.Context, conv string) ([]schema.Message, [][]byte, error) {
	return queryMessagesRaw(ctx, s.r, s.cache, conv, allMessages)
}

func queryMessages(ctx context.Context, q querier, c *messageCache, conv, query string) ([]schema.Message, error) {
	msgs, _, err := scanMessages(ctx, q, c, conv, query, false)
	return msgs, err
}

func queryMessagesRaw(ctx context.Context, q querier, c *messageCache, conv, query string) ([]schema.Message, [][]byte, error) {
	return scanMessages(ctx, q, c, conv, query, true)
}

func scanMessages(ctx context.Context, q querier, c *messageCache, conv, query string, keepBodies bool) ([]schema.Message, [][]byte, error) {
	rows, err := q.QueryContext(ctx, query, conv)
	if err != nil {
		return nil, nil, fmt.Errorf("messages of %s: %w", conv, err)
	}
	defer rows.Close()
	var (
		out    []schema.Message
		bodies [][]byte
	)
	for rows.Next() {
		var (
			id   string
			body []byte
			t    schema.Message
		)
		if err := rows.Scan(&id, &t.IsSummary, &t.CondenseID, &t.CondenseParent, &t.IsTruncationMarker,
			&t.TruncationID, &t.TruncationParent, &t.Tokens, &body); err != nil {
			return nil, nil, fmt.Errorf("messages of %s: %w", conv, err)
		}
		m, ok := c.get(id)
		if !ok {
			if err := schema.UnmarshalStored(body, &m); err != nil {
				return nil, nil, fmt.Errorf("messages of %s: decode %s: %w", conv, id, err)
			}
			c.put(id, m, len(body))
		}
		// The columns are the truth for the tags.
		m.IsSummary, m.CondenseID, m.CondenseParent = t.IsSummary, t.CondenseID, t.CondenseParent
		m.IsTruncationMarker, m.TruncationID, m.TruncationParent = t.IsTruncationMarker, t.TruncationID, t.TruncationParent
		m.Tokens = t.Tokens
		out = append(out, m)
		if keepBodies {
			bodies = append(bodies, body)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("messages of %s: %w", conv, err)
	}
	return out, bodies, nil
}

// Conversation is one conversation's stored history as the engine reads
// it (engine.History): what a test or a tool decides against when it runs
// the engine straight on a store.
type Conversation struct {
	s  *Store
	id string
}

// Conversation returns conversation id's history view.
func (s *Store) Conversation(id string) Conversation { return Conversation{s, id} }

// Messages are the conversation's stored messages (Store.Messages).
func (c Conversation) Messages(ctx context.Context) ([]schema.Message, error) {
	return c.s.Messages(ctx, c.id)
}

// ContextEvents are its condenses and truncations a rewind may undo
// (Store.ContextEvents).
func (c Conversation) ContextEvents(ctx context.Context) ([]schema.ContextEventRef, error) {
	return c.s.ContextEvents(ctx, c.id)
}
