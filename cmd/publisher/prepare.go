package main

import (
	"fmt"
	"strconv"

	"github.com/google/uuid"

	"github.com/ctxpipe/ctxpipe/schema"
)

// preparedIDs is the UUID namespace of the ids Prepare derives.
var preparedIDs = uuid.MustParse("6f1c2b0e-3d7a-4e58-9c41-2a8b5d0f7e93")

// PrepareOptions says how Prepare stamps a transcript's turns.
type PrepareOptions struct {
	Conv string
	// Publisher names who publishes (the NATS user, or the credentials'
	// file): derived ids depend on it too. Input ids are global, so two
	// tenants publishing one file to conversations of the same name must
	// not derive the same ids (the second's turns would be refused as
	// reused ids).
	Publisher    string
	Profile      string // overrides each turn's profile_id when set
	SystemPrompt string // overrides the transcript's system prompt when set
	// Now is the clock for turns without a timestamp (Unix ms).
	Now int64
}

// Prepare readies a transcript's turns for ctx.in.<conv>.turn: each keeps
// its id only when it has a valid one and already belongs to the
// conversation, otherwise it gets one derived from the publisher, the
// conversation, its place in the file and its id there (publishing the same file to another
// conversation must not be taken for a reused id, and publishing it to the
// same one again must not apply it twice: re-publishing is idempotent
// either way); timestamps strictly increase; the system prompt is set on
// every turn (it is "the prompt in force" for that turn). Every turn is
// validated.
func Prepare(tr Transcript, o PrepareOptions) ([]schema.Turn, error) {
	if !schema.ValidConversationID(o.Conv) {
		return nil, fmt.Errorf("conversation id %q must be 1-128 characters of [A-Za-z0-9_-]", o.Conv)
	}
	system := tr.SystemPrompt
	if o.SystemPrompt != "" {
		system = o.SystemPrompt
	}
	out := make([]schema.Turn, len(tr.Turns))
	// Turns without a ts end at Now, one millisecond apart.
	start := o.Now - int64(len(tr.Turns))
	var prev int64
	seen := make(map[string]bool, len(tr.Turns))
	for i, t := range tr.Turns {
		if _, err := uuid.Parse(t.ID); err != nil || len(t.ID) != 36 || t.ConversationID != o.Conv || seen[t.ID] {
			t.ID = uuid.NewSHA1(preparedIDs, []byte(o.Publisher+"\x00"+o.Conv+"\x00"+strconv.Itoa(i)+"\x00"+t.ID)).String()
		}
		seen[t.ID] = true
		t.ConversationID = o.Conv
		if t.TS <= 0 {
			t.TS = start + int64(i)
		}
		if t.TS <= prev {
			t.TS = prev + 1
		}
		prev = t.TS
		if o.Profile != "" {
			t.ProfileID = o.Profile
		}
		if system != "" && t.SystemPrompt == "" {
			t.SystemPrompt = system
		}
		if err := t.Validate(); err != nil {
			return nil, fmt.Errorf("%s: %w", tr.where(i), err)
		}
		out[i] = t
	}
	return out, nil
}
