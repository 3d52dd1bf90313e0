package store

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/ctxpipe/ctxpipe/schema"
)

// committer runs the statements of one Commit transaction.
type committer struct {
	tx    *sql.Tx
	raw   *rawConn // in a bulk load, instead of tx
	start int64    // when the transaction began
	now   int64    // the current group's commit time
	// g is the current group, and published (held) whether its outbox
	// rows are stored as published (held back).
	g         int
	published bool
	held      bool
	// lastPos caches each conversation's highest pos within the transaction,
	// so an append costs no MAX() query after the first.
	lastPos map[string]float64
	// states holds the newest state per conversation; only the last one of
	// a batch is written, once, after every entry has applied.
	states     map[string]stateRow
	stateOrder []string
	// seqs holds the change sequence of each conversation whose history
	// this transaction changes: one step per transaction.
	seqs     map[string]*historySeq
	seqOrder []string
}

// historySeq is a conversation's row of history_seq within a transaction;
// group is the group that took its last step.
type historySeq struct {
	seq, reset int64
	group      int
	// what the transaction appended, for the recent index (recent.go)
	appended appended
}

// stateRow is a conversation's newest state within a transaction and the
// commit time of the group that set it.
type stateRow struct {
	body []byte
	at   int64
}

func newCommitter(now int64) *committer {
	return &committer{now: now, start: now,
		lastPos: map[string]float64{}, states: map[string]stateRow{}, seqs: map[string]*historySeq{}}
}

// group starts group g, committed at at (0: the transaction's start).
func (c *committer) group(g int, at int64, published, held bool) {
	c.g, c.published, c.held, c.now = g, published, held, at
	if at == 0 {
		c.now = c.start
	}
}

func (c *committer) writeStates(ctx context.Context) error {
	for _, conv := range c.stateOrder {
		st := c.states[conv]
		if _, err := c.exec(ctx, qPutState, conv, st.body, st.at); err != nil {
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

// bump returns the change sequence the current group gives conversation
// conv, taking one step past the previous one at its first change; reset
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
		hs.appended.prev = hs.seq
		hs.seq++
		hs.group = c.g
		c.seqs[conv] = hs
		c.seqOrder = append(c.seqOrder, conv)
	} else if hs.group != c.g {
		// One step per group, not per transaction (see Group).
		hs.seq++
		hs.group = c.g
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

// exec and queryRow run q in the transaction. The writer's connection keeps
// the statements it prepared (_stmt_cache_size in Open): preparing them
// again in every transaction was a fifth of a one-input round's work.
func (c *committer) exec(ctx context.Context, q string, args ...any) (sql.Result, error) {
	if c.raw != nil {
		return c.raw.exec(ctx, q, args)
	}
	return c.tx.ExecContext(ctx, q, args...)
}

// row is a query's single row: *sql.Row, or rawRow.
type row interface{ Scan(dest ...any) error }

func (c *committer) queryRow(ctx context.Context, q string, args ...any) (row, error) {
	if c.raw != nil {
		return c.raw.queryRow(ctx, q, args)
	}
	return c.tx.QueryRowContext(ctx, q, args...), nil
}

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
	tenant := in.Tenant()
	res, err := c.exec(ctx, qInsertInput, tenant, in.ID, in.ConversationID, in.Kind, in.Subject, in.TS, x.payload,
		x.hash[:], x.size, string(in.Status), in.Reason, c.now)
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
	row, err := c.queryRow(ctx, qStoredInput, tenant, in.ID)
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
	var (
		seq int64
		ap  *appended // what the recent index learns of this entry's appends
	)
	if changes, more := changesHistory(x); changes {
		var err error
		if seq, err = c.bump(ctx, x.conv, more); err != nil {
			return err
		}
		ap = &c.seqs[x.conv].appended
		// Only appends whose messages are whole can be read back from
		// memory; anything else sends the reads to SQLite.
		ap.unknown = ap.unknown || more || x.replayed
	}
	for _, id := range x.deletes {
		if _, err := c.exec(ctx, qDelete, x.conv, id); err != nil {
			return fmt.Errorf("delete message %s: %w", id, err)
		}
	}
	if len(x.deletes) > 0 {
		// The next append goes after the last message left, as it would
		// in a transaction of its own: a position must not depend on how
		// entries were grouped into transactions, or a database rebuilt
		// from the changelog (other transactions) would differ.
		delete(c.lastPos, x.conv)
	}
	for _, em := range x.msgs {
		if err := c.insertMessage(ctx, x.conv, em, seq); err != nil {
			return err
		}
		if ap != nil && !ap.unknown {
			ap.msgs = append(ap.msgs, recentMsg{m: em.m, body: em.body, seq: seq})
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
		c.states[x.conv] = stateRow{body: x.state, at: c.now}
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
		var published, held any
		switch {
		case c.published:
			published = c.now
		case c.held:
			held = c.now
		}
		if _, err := c.exec(ctx, qPutOutbox, h.ID, ev.subject, ev.body, published, held, h.ConversationID); err != nil {
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
