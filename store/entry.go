package store

import (
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
