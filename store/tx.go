package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	sqlite3 "github.com/mattn/go-sqlite3"
)

// Commit applies a batch of entries, in order, in one transaction: either
// all of it is stored or none of it. For each entry it inserts the input row;
// an id already present makes the entry a Duplicate and its Changes are
// skipped. Otherwise it applies, in the order engine.Apply replays them, the
// deletes, the insertions (in list order, each placed immediately before its
// Before message or appended) and the tag changes; then the state (when
// Changes.State.ConversationID is set) and the events with their outbox rows
// (an event id already stored is skipped).
//
// Every change applies to the entry's Input.ConversationID. A Before or a tag
// change naming a message that does not exist is an error (an *EntryError);
// deleting a message that does not exist is not (the goal is reached).
// A failure because another connection holds the write lock is a
// sqlite3.Error with code ErrBusy or ErrLocked and may succeed if retried;
// every other failure fails the same way again.
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

// SetLogCursor records that the follower read the changelog up to seq (only
// ever raised) when nothing it read needed a commit.
func (s *Store) SetLogCursor(ctx context.Context, seq uint64) error {
	if _, err := s.w.ExecContext(ctx, qPutCursor, seq); err != nil {
		return fmt.Errorf("changelog cursor: %w", err)
	}
	return nil
}
