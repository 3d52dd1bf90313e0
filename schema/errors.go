package schema

import (
	"errors"
	"fmt"
	"unicode/utf8"
)

// Reason is a stable, machine-readable code for why an input was rejected or
// a condense failed. Codes never change meaning; messages may.
type Reason string

// Rejection reasons (input_rejected.reason).
const (
	ReasonInvalidJSON          Reason = "invalid_json"
	ReasonTooLarge             Reason = "too_large"
	ReasonBadSubject           Reason = "bad_subject"
	ReasonUnknownKind          Reason = "unknown_kind"
	ReasonMissingID            Reason = "missing_id"
	ReasonBadID                Reason = "bad_id"
	ReasonBadConversationID    Reason = "bad_conversation_id"
	ReasonConversationMismatch Reason = "conversation_mismatch"
	ReasonBadTS                Reason = "bad_ts"
	ReasonBadRole              Reason = "bad_role"
	ReasonUnknownBlockType     Reason = "unknown_block_type"
	ReasonBadBlock             Reason = "bad_block"
	ReasonOrphanToolResult     Reason = "orphan_tool_result"
	ReasonBadUsage             Reason = "bad_usage"
	ReasonBadTrigger           Reason = "bad_trigger"
	ReasonUnknownProfile       Reason = "unknown_profile"
	ReasonBadProfile           Reason = "bad_profile"
	ReasonUnknownTarget        Reason = "unknown_target"
	ReasonPoison               Reason = "poison" // kept failing transiently until the retry budget ran out
	// ReasonUnknownConversation: a control input (condense, overflow,
	// rewind) names a conversation that has no stored turn.
	ReasonUnknownConversation Reason = "unknown_conversation"
	// ReasonDuplicateID: the input id was used before with other content or
	// in another conversation. Identical redeliveries stay silent no-ops.
	ReasonDuplicateID Reason = "duplicate_id"
	// ReasonBadEncoding: the payload is not valid UTF-8, or is nested deeper
	// than the documented limits.
	ReasonBadEncoding Reason = "bad_encoding"
)

// Condense failure reasons (condense_failed.error).
const (
	ReasonNotEnoughMessages Reason = "not_enough_messages"
	ReasonCondensedRecently Reason = "condensed_recently"
	ReasonContextGrew       Reason = "context_grew"
	ReasonLLMError          Reason = "llm_error"
	ReasonEmptySummary      Reason = "empty_summary"
	// ReasonPinnedOverWindow: the messages that must stay verbatim (pinned,
	// the task, the latest instruction) alone exceed the allowed context, so
	// no condense can bring it under; a truncation still hides what it may.
	ReasonPinnedOverWindow Reason = "pinned_over_window"
	// ReasonNothingToReduce: an overflow reduced nothing: no condense
	// applied (blocked, or tried and failed) and nothing was left to
	// truncate or mask; the context stays as it was.
	ReasonNothingToReduce Reason = "nothing_to_reduce"
)

// ReasonBadInstructions rejects a condense input whose instructions are too
// long, or any other input that carries instructions.
const ReasonBadInstructions Reason = "bad_instructions"

// Error is a validation failure: a stable Reason plus a human message.
type Error struct {
	Reason  Reason
	Message string
}

func (e *Error) Error() string { return string(e.Reason) + ": " + e.Message }

// Errorf returns an *Error with a formatted message.
func Errorf(r Reason, format string, args ...any) *Error {
	return &Error{Reason: r, Message: fmt.Sprintf(format, args...)}
}

// MaxMessageBytes bounds the human message of an event (input_rejected,
// condense_failed): messages quote what an input held, and an input of
// megabytes must not make an event too large to publish.
const MaxMessageBytes = 1024

// Clip returns s cut to at most max bytes, on a character boundary, saying
// how long it was when it had to be cut (for a max shorter than that note,
// the note alone).
func Clip(s string, max int) string {
	if len(s) <= max {
		return s
	}
	suffix := fmt.Sprintf("… (%d bytes in all)", len(s))
	cut := max - len(suffix)
	if cut < 0 {
		cut = 0
	}
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + suffix
}

// ReasonOf returns the Reason carried by err, or "" when err is not (and does
// not wrap) an *Error.
func ReasonOf(err error) Reason {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return ""
}
