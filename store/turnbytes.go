package store

import (
	"strings"

	"github.com/ctxpipe/ctxpipe/schema"
)

// A turn's bytes are stored once: in its message. An applied turn inserts
// its message under the input's own id, and that message's body (its JSON,
// as every history read serves it) holds everything the turn said. The
// input's row keeps only the payload's sha256 and size, which is all that
// telling a redelivery from a reused id needs (SeenInputs, Commit's
// conflict check); its payload column is NULL. A changelog record carries
// the same row, so the turn's bytes travel once too. Every other input
// keeps its payload: a control input (condense, overflow,
// rewind, pin) whole, a rejected one its prefix.

// payloadInMessage reports whether an input's payload is a turn whose bytes
// its message holds: an applied turn whose changes insert a message with the
// input's id. The id is compared without case, as an id stored before ids
// were kept in lower case may differ from its message's in case only.
func payloadInMessage(in InputRecord, ch *schema.Changes) bool {
	if in.Status != StatusApplied || in.Kind != string(schema.KindTurn) || ch == nil {
		return false
	}
	for i := range ch.Insert {
		if strings.EqualFold(ch.Insert[i].Message.ID, in.ID) {
			return true
		}
	}
	return false
}

// StoredInput returns the entry's input as its row keeps it: Payload cut to
// what is stored, nil when the turn's bytes live in its message (see
// payloadInMessage), with Stored set to the whole payload's hash and size.
// The changelog encodes this form.
func (e Entry) StoredInput() InputRecord {
	in := e.Input.StoredForm()
	if payloadInMessage(in, e.Changes) {
		in.Payload = nil
	}
	return in
}
