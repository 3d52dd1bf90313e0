package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
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

// History is a conversation's history as one read of it saw it, for a
// history reply.
type History struct {
	// Messages are the stored messages in position order: every one, or
	// those no summary or marker hides (see Visible). After an incremental
	// read (Incremental) they are only the messages appended since the
	// reader's seq, preceded, when one of them carries a tool result, by
	// up to TailMessages of the visible messages before them (the last
	// ones; fewer when read from memory after a reset), so that the caller
	// can tell which tool calls those results answer; a result whose call
	// is not among them needs a full read.
	Messages []schema.Message
	// Bodies holds the stored body (see Visible) of every message the
	// reply may carry, by message id: all of them after a full read, the
	// appended ones after an incremental read.
	Bodies map[string][]byte
	// Incremental is set when the read was incremental: nothing but
	// appends happened since the reader's seq.
	Incremental bool
	// Seq is the conversation's change sequence: every commit that changes
	// its messages or tags takes one step. ResetSeq is the last step that
	// did more than append turns (a condense, truncation, mask, pin or
	// rewind): a reader that read the history at Seq A >= ResetSeq has every
	// message but those stored after A, and those were appended.
	Seq, ResetSeq int64
}

// TailMessages bounds the visible messages an incremental read returns
// before the appended ones.
const TailMessages = 16

// ReadHistory reads a conversation's history (visibleOnly: what Visible
// returns) and its change sequence in one snapshot. With after > 0 and
// nothing but appends since change after, it reads incrementally: only the
// messages stored since (and a short tail before them, see History), in
// time and bytes proportional to them, not to the history. Otherwise it
// reads the whole history with every body. Bodies the cache holds are not
// decoded again.
func (s *Store) ReadHistory(ctx context.Context, conv string, visibleOnly bool, after int64) (History, error) {
	if h, ok := s.recent.read(conv, visibleOnly, after); ok {
		return h, nil
	}
	return s.readHistory(ctx, conv, visibleOnly, after)
}

// readHistory is ReadHistory from SQLite.
func (s *Store) readHistory(ctx context.Context, conv string, visibleOnly bool, after int64) (History, error) {
	h := History{Bodies: map[string][]byte{}}
	tx, err := s.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return h, fmt.Errorf("history of %s: %w", conv, err)
	}
	defer tx.Rollback()
	err = tx.QueryRowContext(ctx, "SELECT seq, reset_seq FROM history_seq WHERE conversation_id = ?", conv).Scan(&h.Seq, &h.ResetSeq)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return h, fmt.Errorf("history of %s: %w", conv, err)
	}
	cols := `m.id, m.is_summary, m.condense_id, m.condense_parent, m.is_truncation_marker,
		m.truncation_id, m.truncation_parent, m.tokens, `
	if after > 0 && after >= h.ResetSeq && after <= h.Seq {
		h.Incremental = true
		// Appended messages carry no parent tags (a tag change is not an
		// append): visible in both views.
		from, found, err := appendedFrom(ctx, tx, conv, after)
		if err != nil {
			return h, err
		}
		var added []posMessage
		if found {
			added, err = s.scanHistory(ctx, tx, conv, h.Bodies, true, `SELECT `+cols+`m.body, m.pos FROM messages m
				WHERE m.conversation_id = ?1 AND m.pos >= ?2 ORDER BY m.pos`, conv, from)
			if err != nil {
				return h, err
			}
		}
		if len(added) > 0 && visibleOnly && hasToolResult(added) {
			q := `SELECT ` + cols + `NULL, m.pos FROM messages m WHERE m.conversation_id = ?1 AND m.pos < ?2` + visibleFilter +
				` ORDER BY m.pos DESC LIMIT ?3`
			tail, err := s.scanHistory(ctx, tx, conv, nil, false, q, conv, added[0].pos, TailMessages)
			if err != nil {
				return h, err
			}
			slices.Reverse(tail)
			added = append(tail, added...)
		}
		for _, m := range added {
			h.Messages = append(h.Messages, m.Message)
		}
		return h, nil
	}
	q := `SELECT ` + cols + `m.body, m.pos FROM messages m WHERE m.conversation_id = ?1`
	if visibleOnly {
		q += visibleFilter
	}
	all, err := s.scanHistory(ctx, tx, conv, h.Bodies, true, q+" ORDER BY m.pos", conv)
	if err != nil {
		return h, err
	}
	h.Messages = make([]schema.Message, len(all))
	for i, m := range all {
		h.Messages[i] = m.Message
	}
	return h, nil
}

// posMessage is a message read with its position.
type posMessage struct {
	schema.Message
	pos float64
}

// appendedFrom finds where the messages stored after seq after begin: the
// position of the first of them (found: there is one). It walks the
// conversation's messages backwards by position in messages_by_pos, which
// holds each one's seq, until a message stored at or before after. Its
// caller reads incrementally only when nothing but appends happened since
// after, and appends go last: the messages stored since are the last ones
// by position, and only they and one more are read, from the index alone.
func appendedFrom(ctx context.Context, tx *sql.Tx, conv string, after int64) (from float64, found bool, err error) {
	rows, err := tx.QueryContext(ctx, `SELECT pos, seq FROM messages INDEXED BY messages_by_pos
		WHERE conversation_id = ?1 ORDER BY pos DESC`, conv)
	if err != nil {
		return 0, false, fmt.Errorf("history of %s: %w", conv, err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			pos float64
			seq int64
		)
		if err := rows.Scan(&pos, &seq); err != nil {
			return 0, false, fmt.Errorf("history of %s: %w", conv, err)
		}
		if seq <= after {
			break
		}
		from, found = pos, true
	}
	if err := rows.Err(); err != nil {
		return 0, false, fmt.Errorf("history of %s: %w", conv, err)
	}
	return from, found, nil
}

// scanHistory runs q, whose columns are the tags, the body (or NULL) and
// pos, and returns the messages decoded (from the cache when it holds
// them). With keep, each body read is put into bodies.
func (s *Store) scanHistory(ctx context.Context, q querier, conv string, bodies map[string][]byte, keep bool, query string, args ...any) ([]posMessage, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("history of %s: %w", conv, err)
	}
	defer rows.Close()
	var (
		out    []posMessage
		missed []int
	)
	for rows.Next() {
		var (
			id string
			t  schema.Message
			b  []byte
			p  float64
		)
		if err := rows.Scan(&id, &t.IsSummary, &t.CondenseID, &t.CondenseParent, &t.IsTruncationMarker,
			&t.TruncationID, &t.TruncationParent, &t.Tokens, &b, &p); err != nil {
			return nil, fmt.Errorf("history of %s: %w", conv, err)
		}
		if keep && b != nil {
			bodies[id] = b
		}
		m, ok := s.cache.get(id)
		switch {
		case ok:
		case b != nil:
			if err := schema.UnmarshalStored(b, &m); err != nil {
				return nil, fmt.Errorf("history of %s: decode %s: %w", conv, id, err)
			}
			s.cache.put(id, m, len(b))
		default:
			m.ID = id
			missed = append(missed, len(out))
		}
		setTags(&m, &t)
		out = append(out, posMessage{m, p})
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("history of %s: %w", conv, err)
	}
	rows.Close()
	if len(missed) > 0 {
		msgs := make([]schema.Message, len(out))
		for i := range out {
			msgs[i] = out[i].Message
		}
		for rest := missed; len(rest) > 0; {
			n := min(len(rest), 500)
			if err := fillBodies(ctx, q, s.cache, conv, msgs, rest[:n]); err != nil {
				return nil, err
			}
			rest = rest[n:]
		}
		for _, i := range missed {
			out[i].Message = msgs[i]
		}
	}
	return out, nil
}

// hasToolResult tells whether any of msgs carries a tool result.
func hasToolResult(msgs []posMessage) bool {
	for i := range msgs {
		if msgs[i].Content.HasBlock(schema.BlockToolResult) {
			return true
		}
	}
	return false
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
// it (stages.History): what a test or a tool decides against when it runs
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

// InputStatus tells whether input id was stored, in any conversation of
// any tenant, and how it ended (a scan of the inputs: for tests and tools).
// Queries should use InputStatusIn: wait_for must not see another
// conversation's input.
func (s *Store) InputStatus(ctx context.Context, id string) (status Status, reason string, found bool, err error) {
	var st string
	err = s.r.QueryRowContext(ctx, "SELECT status, reason FROM inputs WHERE id = ?", id).Scan(&st, &reason)
	if errors.Is(err, sql.ErrNoRows) {
		return "", "", false, nil
	}
	if err != nil {
		return "", "", false, fmt.Errorf("input status %s: %w", id, err)
	}
	return Status(st), reason, true, nil
}

// Conversations lists the ids of the conversations that have a stored state,
// in id order.
func (s *Store) Conversations(ctx context.Context) ([]string, error) {
	rows, err := s.r.QueryContext(ctx, "SELECT id FROM conversations ORDER BY id")
	if err != nil {
		return nil, fmt.Errorf("conversations: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("conversations: %w", err)
		}
		out = append(out, id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("conversations: %w", err)
	}
	return out, nil
}

// ConversationCount is the number of conversations with a stored state.
func (s *Store) ConversationCount(ctx context.Context) (int, error) {
	var n int
	if err := s.r.QueryRowContext(ctx, "SELECT COUNT(*) FROM conversations").Scan(&n); err != nil {
		return 0, fmt.Errorf("conversation count: %w", err)
	}
	return n, nil
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
