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
	"time"

	sqlite3 "github.com/mattn/go-sqlite3"

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
// messages, never inputs). An applied turn's payload is not kept: its
// message holds the turn (see payloadInMessage). Any other applied input
// keeps its payload exactly as received; a rejected one keeps only its first
// RejectedPayloadPrefix bytes, until Prune clears them. Every row keeps the
// whole payload's sha256 (PayloadHash) and size.
type InputRecord struct {
	// ID is the idempotency key, together with Tenant. It must not be
	// empty: for a payload whose id cannot be read, the caller picks a
	// stable substitute (for example one derived from the JetStream stream
	// sequence).
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
	// Stored, when set, says Payload is already what the row keeps (a
	// rejected payload's prefix) and gives the whole payload's hash and
	// size: an input replayed from the changelog, which never carried the
	// whole of a rejected payload.
	Stored *StoredPayload
}

// StoredPayload is the hash and size of a payload of which only a part may
// be at hand.
type StoredPayload struct {
	Hash [32]byte
	Size int
}

// Tenant is the tenant the input came from, read from its subject as
// published (schema.SubjectTenant): "" for the service's own account, or for
// a subject that names no valid tenant. Input ids are unique per tenant: the
// same id from two tenants is two inputs.
func (in InputRecord) Tenant() string { return schema.SubjectTenant(in.Subject) }

// StoredForm returns the record as its row keeps it: Payload cut to what is
// stored, with Stored set. Encoding that form (the changelog does) keeps a
// rejected 8 MiB payload from being carried anywhere.
func (in InputRecord) StoredForm() InputRecord {
	if in.Stored == nil {
		in.Stored = &StoredPayload{Hash: PayloadHash(in.Payload), Size: len(in.Payload)}
		in.Payload = storedPayload(in.Status, in.Payload)
	}
	return in
}

// Entry is one input and what it does. Changes may be nil (the input is only
// recorded). A rejection usually carries Changes with just its input_rejected
// event: Changes.State is written only when State.ConversationID is set, so a
// rejection never clobbers the conversation's state.
type Entry struct {
	Input   InputRecord
	Changes *schema.Changes
	// Encoded, when set, is what Commit writes of Changes as JSON, made by
	// EncodeChanges: by the worker that made the entry (Changes then are
	// whole), or when the entry was first committed and carried by a
	// changelog record, so that a replay writes the very bytes the live
	// commit wrote and encodes nothing again. A replayed entry's Changes
	// need only what is stored beside those bytes: each inserted message's
	// column fields (id, ts, role, the summary, marker and parent fields,
	// tokens, not its content), State.ConversationID, the tags, the deletes
	// and the events; its messages are not put in the message cache (a
	// read decodes them from their bodies when it needs them).
	Encoded *EncodedChanges
}

// EncodedChanges is the JSON Commit stores for an entry's Changes: the body
// of each inserted message (in Changes.Insert's order, without its parent
// tags, which live in their own columns), the state (nil when the entry
// leaves it alone, as when Changes.State.ConversationID is empty), and each
// event (in Changes.Events' order).
type EncodedChanges struct {
	Bodies [][]byte
	State  []byte
	Events [][]byte
	// complete is set by EncodeChanges, whose Changes hold whole messages
	// (a live commit whose worker encoded them ahead): those are cached as
	// an unencoded commit's are. A decoded changelog record's are not.
	complete bool
}

// EncodeChanges returns the JSON Commit stores for e.Changes (nil when it
// has none), checking e as Commit does. It is what a changelog record
// carries: replaying the entry with it writes the same bytes. A worker sets
// it as e.Encoded ahead of the commit, so that the single writer encodes
// nothing (neither for SQLite nor for the record).
func EncodeChanges(e Entry) (*EncodedChanges, error) {
	x, err := encodeEntry(e)
	if err != nil || e.Changes == nil {
		return nil, err
	}
	enc := &EncodedChanges{State: x.state, complete: !x.replayed}
	if len(x.msgs) > 0 {
		enc.Bodies = make([][]byte, len(x.msgs))
		for i, em := range x.msgs {
			enc.Bodies[i] = em.body
		}
	}
	if len(x.events) > 0 {
		enc.Events = make([][]byte, len(x.events))
		for i, ev := range x.events {
			enc.Events[i] = ev.body
		}
	}
	return enc, nil
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
	size    int      // of the whole payload
	payload []byte   // what the row keeps of it
	ch      *schema.Changes
	conv    string
	// replayed: the bodies came encoded from a changelog record
	// (Entry.Encoded); the messages hold only their column fields and are
	// not cached.
	replayed bool
	msgs     []encodedMessage
	events   []encodedEvent
	state    []byte // nil: leave the conversation's state alone
	deletes  []string
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
	if len(batch) == 0 {
		return nil, nil
	}
	tx, err := s.Begin(ctx, []Group{{Entries: batch}})
	if err != nil {
		var ge *GroupError
		if errors.As(err, &ge) {
			err = ge.Err
		}
		return nil, fmt.Errorf("commit: %w", err)
	}
	if err := tx.Commit(nil, 0); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	return tx.Results()[0], nil
}

// Group is one unit of a transaction: the entries of one changelog record.
// Each group is a step of its conversations' change sequences, whatever
// transaction it is applied in, so a database that applies the same groups
// in other transactions (a follower, a rebuild) ends up byte-identical.
type Group struct {
	// At is the commit time the rows record (received_at, updated_at), in
	// Unix milliseconds; 0 means now.
	At      int64
	Entries []Entry
	// Published stores the group's events in the outbox as published
	// already (a rebuild, or changelog records old enough that their
	// events left long ago).
	Published bool
	// Held stores the group's events in the outbox held back: another
	// instance wrote the record, and its relay publishes them. This
	// instance's relay publishes only those CTX_EVENTS still lacks when
	// the hold ends (RelayOptions.Hold). Published wins.
	Held bool
}

// GroupError says which group made Begin fail; the transaction was rolled
// back. Err is usually an *EntryError.
type GroupError struct {
	Group int
	Err   error
}

func (e *GroupError) Error() string { return fmt.Sprintf("group %d: %v", e.Group, e.Err) }

func (e *GroupError) Unwrap() error { return e.Err }

// Tx is a write transaction holding applied groups, not yet committed: the
// caller appends them to the changelog first, then commits with the
// changelog positions they reached (or rolls back when the append failed).
// Only one Tx may be open at a time (SQLite has one writer).
type Tx struct {
	s  *Store
	tx *sql.Tx
	// conn, in a bulk load, is the writer held for the transaction, whose
	// statements run on the driver's connection (see rawConn).
	conn    *sql.Conn
	c       *committer
	enc     [][]encoded
	results [][]Result
	done    bool
}

// Begin applies groups, in order, in one transaction and returns it open.
// A group that cannot be applied fails the whole Begin with a *GroupError,
// after a rollback.
func (s *Store) Begin(ctx context.Context, groups []Group) (*Tx, error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	enc := make([][]encoded, len(groups))
	for g, grp := range groups {
		enc[g] = make([]encoded, len(grp.Entries))
		for i, e := range grp.Entries {
			x, err := encodeEntry(e)
			if err != nil {
				return nil, &GroupError{Group: g, Err: &EntryError{Index: i, InputID: e.Input.ID, Err: err}}
			}
			enc[g][i] = x
		}
	}
	t := &Tx{s: s, c: newCommitter(s.now().UnixMilli()), enc: enc, results: make([][]Result, len(groups))}
	if s.bulk.Load() {
		conn, err := s.w.Conn(ctx)
		if err != nil {
			return nil, fmt.Errorf("begin: %w", err)
		}
		t.conn = conn
		if err := t.raw(func(rc *rawConn) error {
			t.c.raw = rc
			_, err := rc.c.Exec("BEGIN IMMEDIATE", nil)
			return err
		}); err != nil {
			conn.Close()
			return nil, fmt.Errorf("begin: %w", err)
		}
	} else {
		tx, err := s.w.BeginTx(ctx, nil)
		if err != nil {
			return nil, fmt.Errorf("begin: %w", err)
		}
		t.tx, t.c.tx = tx, tx
	}
	err := t.raw(func(*rawConn) error {
		for g, grp := range groups {
			t.c.group(g, grp.At, grp.Published, grp.Held)
			t.results[g] = make([]Result, len(enc[g]))
			for i := range enc[g] {
				r, err := t.c.apply(ctx, &enc[g][i])
				if err != nil {
					return &GroupError{Group: g, Err: &EntryError{Index: i, InputID: enc[g][i].in.ID, Err: err}}
				}
				t.results[g][i] = r
			}
		}
		return t.c.writeStates(ctx)
	})
	if err != nil {
		t.Rollback()
		return nil, err
	}
	return t, nil
}

// raw runs f: in a bulk load on the driver's connection (which f may use
// only while it runs), else at once.
func (t *Tx) raw(f func(*rawConn) error) error {
	if t.conn == nil {
		return f(nil)
	}
	return t.conn.Raw(func(dc any) error {
		c, ok := dc.(*sqlite3.SQLiteConn)
		if !ok {
			return fmt.Errorf("the writer's driver connection is a %T", dc)
		}
		if t.c.raw == nil {
			t.c.raw = &rawConn{c: c, stmts: map[string]driver.Stmt{}}
		}
		t.c.raw.c = c
		return f(t.c.raw)
	})
}

// end finishes a bulk load's transaction with COMMIT or ROLLBACK and gives
// the connection back.
func (t *Tx) end(q string) error {
	err := t.raw(func(rc *rawConn) error {
		_, err := rc.c.Exec(q, nil)
		for _, st := range rc.stmts {
			st.Close()
		}
		return err
	})
	t.conn.Close()
	return err
}

// Results are the outcomes of each group's entries.
func (t *Tx) Results() [][]Result { return t.results }

// Commit records the changelog positions (partition → CTX_STATE sequence,
// only ever raised) and the follower's cursor (0: unchanged), and commits.
func (t *Tx) Commit(positions map[int]uint64, cursor uint64) error {
	if t.done {
		return errors.New("transaction already finished")
	}
	t.done = true
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := t.raw(func(*rawConn) error {
		for p, seq := range positions {
			if _, err := t.c.exec(ctx, qPutPosition, p, seq); err != nil {
				return fmt.Errorf("changelog position of %d: %w", p, err)
			}
		}
		if cursor > 0 {
			if _, err := t.c.exec(ctx, qPutCursor, cursor); err != nil {
				return fmt.Errorf("changelog cursor: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		t.done = false
		t.Rollback()
		return err
	}
	if t.conn != nil {
		err = t.end("COMMIT")
	} else {
		// From the COMMIT until the recent index has it, readers of these
		// conversations read SQLite: it may be ahead of the index.
		t.s.recent.committing(t.c.seqOrder, 1)
		err = t.tx.Commit()
		if err == nil {
			for _, conv := range t.c.seqOrder {
				hs := t.c.seqs[conv]
				t.s.recent.committed(conv, hs.seq, hs.reset, &hs.appended)
			}
		}
		t.s.recent.committing(t.c.seqOrder, -1)
	}
	if err != nil {
		return err
	}
	t.s.ckpt.committed()
	// The next batch of these conversations reads these messages back at
	// once: keep them decoded rather than decode the bodies just encoded.
	for g := range t.enc {
		for i := range t.enc[g] {
			if !t.results[g][i].Duplicate && !t.enc[g][i].replayed {
				for _, em := range t.enc[g][i].msgs {
					t.s.cache.put(em.m.ID, em.m, len(em.body))
				}
			}
		}
	}
	return nil
}

// Rollback undoes everything Begin applied.
func (t *Tx) Rollback() error {
	if t.done {
		return nil
	}
	t.done = true
	if t.conn != nil {
		return t.end("ROLLBACK")
	}
	return t.tx.Rollback()
}

// LogPositions returns how far this database has applied each partition's
// changelog, and the follower's cursor (0 before any).
func (s *Store) LogPositions(ctx context.Context) (map[int]uint64, uint64, error) {
	rows, err := s.w.QueryContext(ctx, `SELECT partition, seq FROM changelog_positions`)
	if err != nil {
		return nil, 0, fmt.Errorf("changelog positions: %w", err)
	}
	defer rows.Close()
	pos := map[int]uint64{}
	for rows.Next() {
		var p int
		var seq uint64
		if err := rows.Scan(&p, &seq); err != nil {
			return nil, 0, fmt.Errorf("changelog positions: %w", err)
		}
		pos[p] = seq
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("changelog positions: %w", err)
	}
	var cursor uint64
	err = s.w.QueryRowContext(ctx, `SELECT seq FROM changelog_cursor WHERE id = 0`).Scan(&cursor)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, 0, fmt.Errorf("changelog cursor: %w", err)
	}
	return pos, cursor, nil
}

func encodeEntry(e Entry) (encoded, error) {
	in := e.Input
	x := encoded{in: in, ch: e.Changes, conv: in.ConversationID}
	if in.Stored != nil {
		x.hash, x.size, x.payload = in.Stored.Hash, in.Stored.Size, in.Payload
	} else {
		x.hash, x.size, x.payload = PayloadHash(in.Payload), len(in.Payload), storedPayload(in.Status, in.Payload)
	}
	if payloadInMessage(in, e.Changes) {
		// A record written before turns were stored once carries the
		// payload too: the row is the same whatever the record held.
		x.payload = nil
	}
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
	enc := e.Encoded
	if enc != nil {
		if len(enc.Bodies) != len(ch.Insert) || len(enc.Events) != len(ch.Events) || (enc.State != nil) != (ch.State.ConversationID != "") {
			return x, fmt.Errorf("encoded changes (%d bodies, %d events, state %v) do not match the changes (%d messages, %d events, state %v)",
				len(enc.Bodies), len(enc.Events), enc.State != nil, len(ch.Insert), len(ch.Events), ch.State.ConversationID != "")
		}
		x.replayed = !enc.complete
	}
	if len(ch.Insert) > 0 {
		x.msgs = make([]encodedMessage, 0, len(ch.Insert))
	}
	for i, ins := range ch.Insert {
		m := ins.Message
		if m.ID == "" {
			return x, errors.New("inserted message has no id")
		}
		if m.ConversationID == "" {
			m.ConversationID = x.conv
		} else if m.ConversationID != x.conv {
			return x, fmt.Errorf("message %s names conversation %q, input is for %q", m.ID, m.ConversationID, x.conv)
		}
		var body []byte
		if enc != nil {
			body = enc.Bodies[i]
		} else {
			// The parent tags change after insertion and live only in
			// their columns; reads put them back.
			b := m
			b.CondenseParent, b.TruncationParent = "", ""
			var err error
			if body, err = schema.Marshal(&b); err != nil {
				return x, fmt.Errorf("encode message %s: %w", m.ID, err)
			}
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
		if enc != nil {
			x.state = enc.State
		} else {
			st, err := schema.Marshal(&ch.State)
			if err != nil {
				return x, fmt.Errorf("encode state: %w", err)
			}
			x.state = st
		}
	}
	for i, ev := range ch.Events {
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
		var body []byte
		if enc != nil {
			body = enc.Events[i]
		} else {
			var err error
			if body, err = schema.Marshal(ev); err != nil {
				return x, fmt.Errorf("encode event %s: %w", h.ID, err)
			}
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

// rawConn runs a bulk load's statements on the driver's connection,
// without database/sql: a rebuild runs some twenty thousand statements a
// second or more, and database/sql's locking, argument checks and result
// wrapping were a tenth of their time. Its arguments are those the
// committer passes: strings, byte slices, integers, floats, booleans and
// nil.
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

const (
	qInsertInput = `INSERT INTO inputs (tenant, id, conversation_id, kind, subject, ts, payload, payload_hash, payload_size,
		status, reason, received_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, id) DO NOTHING`
	qStoredInput   = `SELECT conversation_id, payload_hash FROM inputs WHERE tenant = ? AND id = ?`
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
	qPutOutbox = `INSERT INTO outbox (event_id, subject, data, published_at, held_since, conv) VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (event_id) DO NOTHING`

	qPutPosition = `INSERT INTO changelog_positions (partition, seq) VALUES (?, ?)
		ON CONFLICT (partition) DO UPDATE SET seq = MAX(seq, excluded.seq)`
	qPutCursor = `INSERT INTO changelog_cursor (id, seq) VALUES (0, ?) ON CONFLICT (id) DO UPDATE SET seq = MAX(seq, excluded.seq)`
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

// SetLogCursor records that the follower read the changelog up to seq (only
// ever raised) when nothing it read needed a commit.
func (s *Store) SetLogCursor(ctx context.Context, seq uint64) error {
	if _, err := s.w.ExecContext(ctx, qPutCursor, seq); err != nil {
		return fmt.Errorf("changelog cursor: %w", err)
	}
	return nil
}
