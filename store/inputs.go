package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/ctxpipe/ctxpipe/schema"
)

// RejectedPayloadPrefix is how many bytes of a rejected input's payload are
// stored: enough to see what was sent, never the whole of an oversized one
// (a too_large rejection may carry 8 MiB). The full payload's sha256 and size
// are stored beside the prefix, and Prune later clears the prefix too.
// Applied inputs keep their whole payload.
const RejectedPayloadPrefix = 4 << 10

// PayloadHash is the hash stored with every input: sha256 of the payload
// bytes exactly as received. Compare it with SeenInput.PayloadHash to tell an
// identical redelivery from a reused id.
func PayloadHash(payload []byte) [32]byte { return sha256.Sum256(payload) }

// storedPayload is the part of an input's payload that its row keeps.
func storedPayload(status Status, payload []byte) []byte {
	if status == StatusRejected && len(payload) > RejectedPayloadPrefix {
		return payload[:RejectedPayloadPrefix]
	}
	return payload
}

// backfillInputs gives the rows stored before migration 3 their hash and size
// and cuts their rejected payloads to the prefix. It pages by rowid so that
// no statement reads a table it is updating.
func backfillInputs(ctx context.Context, tx *sql.Tx) error {
	type row struct {
		rowid   int64
		payload []byte
		status  Status
	}
	var after int64
	for {
		rows, err := tx.QueryContext(ctx, `SELECT rowid, payload, status FROM inputs WHERE rowid > ? ORDER BY rowid LIMIT 256`, after)
		if err != nil {
			return fmt.Errorf("backfill input hashes: %w", err)
		}
		var page []row
		for rows.Next() {
			var r row
			var st string
			if err := rows.Scan(&r.rowid, &r.payload, &st); err != nil {
				rows.Close()
				return fmt.Errorf("backfill input hashes: %w", err)
			}
			r.status = Status(st)
			page = append(page, r)
		}
		if err := rows.Close(); err != nil {
			return fmt.Errorf("backfill input hashes: %w", err)
		}
		if len(page) == 0 {
			return nil
		}
		for _, r := range page {
			h := PayloadHash(r.payload)
			if _, err := tx.ExecContext(ctx, `UPDATE inputs SET payload_hash = ?, payload_size = ?, payload = ? WHERE rowid = ?`,
				h[:], len(r.payload), storedPayload(r.status, r.payload), r.rowid); err != nil {
				return fmt.Errorf("backfill input hashes: %w", err)
			}
		}
		after = page[len(page)-1].rowid
	}
}

// SeenInput is what the store knows of an input id already stored.
type SeenInput struct {
	ConversationID string
	// PayloadHash is PayloadHash of the payload as first received (of the
	// whole payload, also for a rejected input that keeps only a prefix).
	PayloadHash [32]byte
	Status      Status
}

// SeenInputs returns, for each of ids that tenant ("" for the service's own
// account) already stored as an input, its conversation, payload hash and
// status, in one query per 250 ids (each looked up in both forms, see
// legacyForm). Another tenant's inputs are never found: input ids are unique
// per tenant. The pipeline checks a lane batch with it: the same
// conversation and hash is an identical redelivery (a silent no-op);
// anything else is a reused id.
func (s *Store) SeenInputs(ctx context.Context, tenant string, ids []string) (map[string]SeenInput, error) {
	seen := make(map[string]SeenInput, len(ids))
	for len(ids) > 0 {
		n := min(len(ids), 250) // two forms each, under SQLite's bound-parameter limit
		args := make([]any, 0, 2*n+1)
		args = append(args, tenant)
		for _, id := range ids[:n] {
			args = append(args, id, legacyForm(id))
		}
		q := "SELECT id, conversation_id, payload_hash, status FROM inputs WHERE tenant = ? AND id IN (?" + strings.Repeat(",?", len(args)-2) + ")"
		rows, err := s.r.QueryContext(ctx, q, args...)
		if err != nil {
			return nil, fmt.Errorf("seen inputs: %w", err)
		}
		for rows.Next() {
			var (
				id, st string
				hash   []byte
				si     SeenInput
			)
			if err := rows.Scan(&id, &si.ConversationID, &hash, &st); err != nil {
				rows.Close()
				return nil, fmt.Errorf("seen inputs: %w", err)
			}
			copy(si.PayloadHash[:], hash)
			si.Status = Status(st)
			seen[strings.ToLower(id)] = si
		}
		if err := rows.Close(); err != nil {
			return nil, fmt.Errorf("seen inputs: %w", err)
		}
		ids = ids[n:]
	}
	return seen, nil
}

// InputStatusIn tells whether input id was stored for conversation conv (a
// conversation key, with its tenant) and how it ended. It backs
// ctx.q.history's wait_for: an id stored for another conversation, of this
// tenant or another, is not found, so no agent is told that its turn landed
// when a different conversation's input with the same id did.
func (s *Store) InputStatusIn(ctx context.Context, conv, id string) (status Status, reason string, found bool, err error) {
	var st string
	tenant, _ := schema.SplitKey(conv)
	err = s.r.QueryRowContext(ctx, "SELECT status, reason FROM inputs WHERE tenant = ? AND id IN (?, ?) AND conversation_id = ? LIMIT 1",
		tenant, id, legacyForm(id), conv).Scan(&st, &reason)
	if errors.Is(err, sql.ErrNoRows) {
		return s.reusedIDStatus(ctx, conv, id)
	}
	if err != nil {
		return "", "", false, fmt.Errorf("input status %s in %s: %w", id, conv, err)
	}
	return Status(st), reason, true, nil
}

// reusedIDStatus finds an input of conv rejected because its id was used
// before (duplicate_id): the rejection is stored under an id of its own,
// and only its input_rejected event names the id the agent sent.
func (s *Store) reusedIDStatus(ctx context.Context, conv, id string) (Status, string, bool, error) {
	var body []byte
	// The type is written out, so that the partial index
	// events_rejected_inputs serves the lookup.
	err := s.r.QueryRowContext(ctx, `SELECT body FROM events WHERE conversation_id = ? AND type = 'input_rejected' AND input_id IN (?, ?) LIMIT 1`,
		conv, id, legacyForm(id)).Scan(&body)
	if errors.Is(err, sql.ErrNoRows) {
		return "", "", false, nil
	}
	if err != nil {
		return "", "", false, fmt.Errorf("input status %s in %s: %w", id, conv, err)
	}
	reason := string(schema.ReasonDuplicateID)
	if ev, err := schema.DecodeEvent(body); err == nil {
		if r, ok := ev.(*schema.InputRejected); ok {
			reason = string(r.Reason)
		}
	}
	return StatusRejected, reason, true, nil
}

// legacyForm is the upper-case form of an input id. Ids are kept in lower
// case (schema.CanonicalID); before that they were kept as sent, and the
// clients that send upper case send all of it (Swift's uuidString): an
// input stored so before is still found when it comes again.
func legacyForm(id string) string { return strings.ToUpper(id) }

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
