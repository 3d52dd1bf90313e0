package store

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/ctxpipe/ctxpipe/schema"
)

// Status is what became of an input.
type Status string

// The two input statuses.
const (
	StatusApplied  Status = "applied"
	StatusRejected Status = "rejected"
)

// InputRecord is the inputs row of one input, kept forever (a rewind deletes
// messages, never inputs). An applied input keeps its payload exactly as
// received; a rejected one keeps only its first RejectedPayloadPrefix bytes,
// until Prune clears them. Every row keeps the whole payload's sha256
// (PayloadHash) and size.
type InputRecord struct {
	// ID is the idempotency key. It must not be empty: for a payload whose id
	// cannot be read, the caller picks a stable substitute (for example one
	// derived from the JetStream stream sequence).
	ID string
	// ConversationID may be empty only for a rejected input whose subject
	// named no usable conversation.
	ConversationID string
	Kind           string // the subject's last token; free text for rejected inputs
	Subject        string
	TS             int64
	Payload        []byte
	Status         Status
	Reason         string // the rejection reason code; empty when applied
}

// Entry is one input and what it does. Changes may be nil (the input is only
// recorded). A rejection usually carries Changes with just its input_rejected
// event: Changes.State is written only when State.ConversationID is set, so a
// rejection never clobbers the conversation's state.
type Entry struct {
	Input   InputRecord
	Changes *schema.Changes
}

// Result is the outcome of one Entry of a committed batch.
type Result struct {
	InputID string
	// Duplicate is true when the input id was already stored (by an earlier
	// batch or earlier in this one): its Changes were skipped, and the caller
	// should simply ack it.
	Duplicate bool
	// Conflict is true, with Duplicate, when the stored input with this id
	// has another conversation or another payload hash: the id was reused
	// for a different input, which was not stored. The caller should reject
	// it (duplicate_id) rather than treat it as a redelivery.
	Conflict bool
}

// EntryError says which entry of a batch made Commit fail. The whole batch
// was rolled back; the caller may retry the other entries without it.
type EntryError struct {
	Index   int
	InputID string
	Err     error
}

func (e *EntryError) Error() string {
	return fmt.Sprintf("entry %d (input %s): %v", e.Index, e.InputID, e.Err)
}

func (e *EntryError) Unwrap() error { return e.Err }

// encoded is an Entry with every JSON body made before the transaction
// starts, so the write lock is held only for SQL.
type encoded struct {
	in      InputRecord
	hash    [32]byte // of the whole payload
	payload []byte   // what the row keeps of it
	ch      *schema.Changes
	conv    string
	msgs    []encodedMessage
	events  []encodedEvent
	state   []byte // nil: leave the conversation's state alone
	deletes []string
}

type encodedMessage struct {
	m      schema.Message
	before string
	body   []byte
}

type encodedEvent struct {
	h       *schema.EventHeader
	ref     string
	subject string
	body    []byte
}

// Commit applies a batch of entries, in order, in one transaction: either
// all of it is stored or none of it. For each entry it inserts the input row;
// an id already present makes the entry a Duplicate and its Changes are
// skipped. Otherwise it applies, in the order stages.Apply replays them, the
// deletes, the insertions (in list order, each placed immediately before its
// Before message or appended) and the tag changes; then the state (when
// Changes.State.ConversationID is set) and the events with their outbox rows
// (an event id already stored is skipped).
//
// Every change applies to the entry's Input.ConversationID. A Before or a tag
// change naming a message that does not exist is an error (an *EntryError);
// deleting a message that does not exist is not (the goal is reached).
// IsTransient tells whether a failure is worth retrying unchanged.
func (s *Store) Commit(ctx context.Context, batch []Entry) ([]Result, error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	if len(batch) == 0 {
		return nil, nil
	}
	enc := make([]encoded, len(batch))
	for i, e := range batch {
		x, err := encodeEntry(e)
		if err != nil {
			return nil, fmt.Errorf("commit: %w", &EntryError{Index: i, InputID: e.Input.ID, Err: err})
		}
		enc[i] = x
	}
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("commit: begin: %w", err)
	}
	defer tx.Rollback() // a no-op after Commit
	c := newCommitter(tx, s.now().UnixMilli())
	results := make([]Result, len(enc))
	for i := range enc {
		r, err := c.apply(ctx, &enc[i])
		if err != nil {
			return nil, fmt.Errorf("commit: %w", &EntryError{Index: i, InputID: enc[i].in.ID, Err: err})
		}
		results[i] = r
	}
	if err := c.writeStates(ctx); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	// The next batch of these conversations reads these messages back at
	// once: keep them decoded rather than decode the bodies just encoded.
	for i := range enc {
		if !results[i].Duplicate {
			for _, em := range enc[i].msgs {
				s.cache.put(em.m.ID, em.m, len(em.body))
			}
		}
	}
	return results, nil
}

func encodeEntry(e Entry) (encoded, error) {
	in := e.Input
	x := encoded{in: in, ch: e.Changes, conv: in.ConversationID,
		hash: PayloadHash(in.Payload), payload: storedPayload(in.Status, in.Payload)}
	if in.ID == "" {
		return x, errors.New("input id is empty")
	}
	switch in.Status {
	case StatusApplied, StatusRejected:
	default:
		return x, fmt.Errorf("input status %q is neither %q nor %q", in.Status, StatusApplied, StatusRejected)
	}
	ch := e.Changes
	if ch == nil {
		return x, nil
	}
	if x.conv == "" && (len(ch.Insert) > 0 || len(ch.Tags) > 0 || len(ch.Delete) > 0 || ch.State.ConversationID != "") {
		return x, errors.New("changes to messages or state need the input's conversation id")
	}
	for _, ins := range ch.Insert {
		m := ins.Message
		if m.ID == "" {
			return x, errors.New("inserted message has no id")
		}
		if m.ConversationID == "" {
			m.ConversationID = x.conv
		} else if m.ConversationID != x.conv {
			return x, fmt.Errorf("message %s names conversation %q, input is for %q", m.ID, m.ConversationID, x.conv)
		}
		// The parent tags change after insertion and live only in their
		// columns; reads put them back.
		b := m
		b.CondenseParent, b.TruncationParent = "", ""
		body, err := schema.Marshal(&b)
		if err != nil {
			return x, fmt.Errorf("encode message %s: %w", m.ID, err)
		}
		x.msgs = append(x.msgs, encodedMessage{m: m, before: ins.Before, body: body})
	}
	for _, t := range ch.Tags {
		if _, err := tagColumn(t.Field); err != nil {
			return x, err
		}
	}
	x.deletes = ch.Delete
	if ch.State.ConversationID != "" {
		if ch.State.ConversationID != x.conv {
			return x, fmt.Errorf("state names conversation %q, input is for %q", ch.State.ConversationID, x.conv)
		}
		st, err := schema.Marshal(&ch.State)
		if err != nil {
			return x, fmt.Errorf("encode state: %w", err)
		}
		x.state = st
	}
	for _, ev := range ch.Events {
		if ev == nil {
			return x, errors.New("nil event")
		}
		h := ev.Header()
		if h.ID == "" || h.Type == "" {
			return x, fmt.Errorf("event %q of type %q needs an id and a type", h.ID, h.Type)
		}
		// An invalid subject token would make the relay fail on this row
		// forever and hold every later event back.
		if !schema.ValidConversationKey(h.ConversationID) {
			return x, fmt.Errorf("event %s: conversation id %q is not a valid subject token", h.ID, h.ConversationID)
		}
		body, err := schema.Marshal(ev)
		if err != nil {
			return x, fmt.Errorf("encode event %s: %w", h.ID, err)
		}
		x.events = append(x.events, encodedEvent{h: h, ref: eventRef(ev), subject: schema.EventSubject(ev), body: body})
	}
	return x, nil
}

// eventRef is the summary or marker id that a condense or truncation event
// names, so a rewind can find it without decoding bodies.
func eventRef(e schema.Event) string {
	switch v := e.(type) {
	case *schema.CondenseContext:
		return v.CondenseID
	case *schema.SlidingWindowTruncation:
		return v.TruncationID
	}
	return ""
}

func tagColumn(f schema.TagField) (string, error) {
	switch f {
	case schema.TagCondenseParent:
		return "condense_parent", nil
	case schema.TagTruncationParent:
		return "truncation_parent", nil
	}
	return "", fmt.Errorf("unknown tag field %q", f)
}

// committer runs the statements of one Commit transaction, preparing each
// distinct statement once per transaction.
type committer struct {
	tx    *sql.Tx
	now   int64
	stmts map[string]*sql.Stmt
	// lastPos caches each conversation's highest pos within the transaction,
	// so an append costs no MAX() query after the first.
	lastPos map[string]float64
	// states holds the newest state per conversation; only the last one of
	// a batch is written, once, after every entry has applied.
	states     map[string][]byte
	stateOrder []string
	// seqs holds the change sequence of each conversation whose history
	// this transaction changes: one step per transaction.
	seqs     map[string]*historySeq
	seqOrder []string
}

// historySeq is a conversation's row of history_seq within a transaction.
type historySeq struct {
	seq, reset int64
}

func newCommitter(tx *sql.Tx, now int64) *committer {
	return &committer{tx: tx, now: now, stmts: map[string]*sql.Stmt{},
		lastPos: map[string]float64{}, states: map[string][]byte{}, seqs: map[string]*historySeq{}}
}

func (c *committer) writeStates(ctx context.Context) error {
	for _, conv := range c.stateOrder {
		if _, err := c.exec(ctx, qPutState, conv, c.states[conv], c.now); err != nil {
			return fmt.Errorf("put state of %s: %w", conv, err)
		}
	}
	for _, conv := range c.seqOrder {
		hs := c.seqs[conv]
		if _, err := c.exec(ctx, qPutSeq, conv, hs.seq, hs.reset); err != nil {
			return fmt.Errorf("put change sequence of %s: %w", conv, err)
		}
	}
	return nil
}

// bump returns the change sequence this transaction gives conversation
// conv, taking one step past the stored one at its first change; reset
// records that the change was more than an append.
func (c *committer) bump(ctx context.Context, conv string, reset bool) (int64, error) {
	hs, ok := c.seqs[conv]
	if !ok {
		hs = &historySeq{}
		row, err := c.queryRow(ctx, qGetSeq, conv)
		if err == nil {
			err = row.Scan(&hs.seq, &hs.reset)
		}
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return 0, fmt.Errorf("change sequence of %s: %w", conv, err)
		}
		hs.seq++
		c.seqs[conv] = hs
		c.seqOrder = append(c.seqOrder, conv)
	}
	if reset {
		hs.reset = hs.seq
	}
	return hs.seq, nil
}

// changesHistory tells whether an applied entry changes its conversation's
// history (or how the effective history is made of it), and whether it
// does more than append: only a turn whose changes are appends alone
// leaves what a reader has read as it was.
func changesHistory(x *encoded) (changes, more bool) {
	if x.in.Status != StatusApplied || x.ch == nil || x.conv == "" {
		return false, false
	}
	more = x.in.Kind != string(schema.KindTurn) || len(x.deletes) > 0 || len(x.ch.Tags) > 0
	for _, em := range x.msgs {
		if em.before != "" {
			more = true
		}
	}
	return more || len(x.msgs) > 0, more
}

func (c *committer) stmt(ctx context.Context, q string) (*sql.Stmt, error) {
	if st, ok := c.stmts[q]; ok {
		return st, nil
	}
	st, err := c.tx.PrepareContext(ctx, q)
	if err != nil {
		return nil, err
	}
	c.stmts[q] = st
	return st, nil
}

func (c *committer) exec(ctx context.Context, q string, args ...any) (sql.Result, error) {
	st, err := c.stmt(ctx, q)
	if err != nil {
		return nil, err
	}
	return st.ExecContext(ctx, args...)
}

func (c *committer) queryRow(ctx context.Context, q string, args ...any) (*sql.Row, error) {
	st, err := c.stmt(ctx, q)
	if err != nil {
		return nil, err
	}
	return st.QueryRowContext(ctx, args...), nil
}

const (
	qInsertInput = `INSERT INTO inputs (id, conversation_id, kind, subject, ts, payload, payload_hash, payload_size,
		status, reason, received_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING`
	qStoredInput   = `SELECT conversation_id, payload_hash FROM inputs WHERE id = ?`
	qInsertMessage = `INSERT INTO messages (conversation_id, id, pos, ts, role, is_summary, condense_id, condense_parent,
		is_truncation_marker, truncation_id, truncation_parent, tokens, body, seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	qGetSeq = `SELECT seq, reset_seq FROM history_seq WHERE conversation_id = ?`
	qPutSeq = `INSERT INTO history_seq (conversation_id, seq, reset_seq) VALUES (?, ?, ?)
		ON CONFLICT (conversation_id) DO UPDATE SET seq = excluded.seq, reset_seq = excluded.reset_seq`
	qLastPos   = `SELECT COALESCE(MAX(pos), 0) FROM messages WHERE conversation_id = ?`
	qPosOf     = `SELECT pos FROM messages WHERE conversation_id = ? AND id = ?`
	qPrevPos   = `SELECT MAX(pos) FROM messages WHERE conversation_id = ? AND pos < ?`
	qRenumber  = `UPDATE messages SET pos = r.n FROM (SELECT id, ROW_NUMBER() OVER (ORDER BY pos) AS n FROM messages WHERE conversation_id = ?1) AS r WHERE messages.conversation_id = ?1 AND messages.id = r.id`
	qDelete    = `DELETE FROM messages WHERE conversation_id = ? AND id = ?`
	qPutState  = `INSERT INTO conversations (id, state, updated_at) VALUES (?, ?, ?) ON CONFLICT (id) DO UPDATE SET state = excluded.state, updated_at = excluded.updated_at`
	qPutEvent  = `INSERT INTO events (id, conversation_id, type, ts, input_id, ref_id, body) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING`
	qPutOutbox = `INSERT INTO outbox (event_id, subject, data) VALUES (?, ?, ?) ON CONFLICT (event_id) DO NOTHING`
)

// ErrIDConflict fails a batch holding an applied input whose id was stored
// meanwhile with another conversation or other content. Retrying the batch
// after checking the ids again resolves it.
var ErrIDConflict = errors.New("input id taken meanwhile by another input")

// apply runs one entry inside the batch transaction and reports whether it
// was a duplicate, and whether that duplicate is a reused id.
func (c *committer) apply(ctx context.Context, x *encoded) (Result, error) {
	r, err := c.applyInput(ctx, x)
	if err == nil && r.Conflict && x.ch != nil && x.in.Status == StatusApplied {
		// Another conversation's input (or other content) took this id
		// between the caller's duplicate check and this commit. Skipping
		// the changes would leave the caller's later inputs, prepared on
		// top of them, inconsistent: fail the batch instead, so that the
		// caller checks again and rejects this input as a reused id.
		return r, ErrIDConflict
	}
	if err != nil || r.Duplicate {
		return r, err
	}
	return r, c.applyChanges(ctx, x)
}

func (c *committer) applyInput(ctx context.Context, x *encoded) (Result, error) {
	in := x.in
	r := Result{InputID: in.ID}
	res, err := c.exec(ctx, qInsertInput, in.ID, in.ConversationID, in.Kind, in.Subject, in.TS, x.payload,
		x.hash[:], len(in.Payload), string(in.Status), in.Reason, c.now)
	if err != nil {
		return r, fmt.Errorf("insert input: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return r, fmt.Errorf("insert input: %w", err)
	} else if n > 0 {
		return r, nil
	}
	r.Duplicate = true
	var (
		conv string
		hash []byte
	)
	row, err := c.queryRow(ctx, qStoredInput, in.ID)
	if err == nil {
		err = row.Scan(&conv, &hash)
	}
	if err != nil {
		return r, fmt.Errorf("read stored input: %w", err)
	}
	r.Conflict = conv != in.ConversationID || !bytes.Equal(hash, x.hash[:])
	return r, nil
}

func (c *committer) applyChanges(ctx context.Context, x *encoded) error {
	if x.ch == nil {
		return nil
	}
	var seq int64
	if changes, more := changesHistory(x); changes {
		var err error
		if seq, err = c.bump(ctx, x.conv, more); err != nil {
			return err
		}
	}
	for _, id := range x.deletes {
		if _, err := c.exec(ctx, qDelete, x.conv, id); err != nil {
			return fmt.Errorf("delete message %s: %w", id, err)
		}
	}
	for _, em := range x.msgs {
		if err := c.insertMessage(ctx, x.conv, em, seq); err != nil {
			return err
		}
	}
	for _, t := range x.ch.Tags {
		col, _ := tagColumn(t.Field) // checked by encodeEntry
		res, err := c.exec(ctx, "UPDATE messages SET "+col+" = ? WHERE conversation_id = ? AND id = ?", t.Value, x.conv, t.MessageID)
		if err != nil {
			return fmt.Errorf("set %s on %s: %w", col, t.MessageID, err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return fmt.Errorf("set %s on %s: %w", col, t.MessageID, err)
		} else if n == 0 {
			return fmt.Errorf("set %s: message %s not found in conversation %s", col, t.MessageID, x.conv)
		}
	}
	if x.state != nil {
		if _, ok := c.states[x.conv]; !ok {
			c.stateOrder = append(c.stateOrder, x.conv)
		}
		c.states[x.conv] = x.state
	}
	for _, ev := range x.events {
		h := ev.h
		res, err := c.exec(ctx, qPutEvent, h.ID, h.ConversationID, string(h.Type), h.TS, h.InputID, ev.ref, ev.body)
		if err != nil {
			return fmt.Errorf("insert event %s: %w", h.ID, err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return fmt.Errorf("insert event %s: %w", h.ID, err)
		} else if n == 0 {
			continue // already stored, and so already in the outbox
		}
		if _, err := c.exec(ctx, qPutOutbox, h.ID, ev.subject, ev.body); err != nil {
			return fmt.Errorf("outbox event %s: %w", h.ID, err)
		}
	}
	return nil
}

func (c *committer) insertMessage(ctx context.Context, conv string, em encodedMessage, seq int64) error {
	pos, err := c.position(ctx, conv, em.before)
	if err != nil {
		return fmt.Errorf("insert message %s: %w", em.m.ID, err)
	}
	m := em.m
	if _, err := c.exec(ctx, qInsertMessage, conv, m.ID, pos, m.TS, string(m.Role), m.IsSummary, m.CondenseID,
		m.CondenseParent, m.IsTruncationMarker, m.TruncationID, m.TruncationParent, m.Tokens, em.body, seq); err != nil {
		return fmt.Errorf("insert message %s: %w", m.ID, err)
	}
	return nil
}

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
		// Deletes never invalidate this: a new last message only has to
		// sort after every remaining one.
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
