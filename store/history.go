package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"

	"github.com/ctxpipe/ctxpipe/schema"
)

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
