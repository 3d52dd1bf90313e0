package schema

import (
	"encoding/json"
	"fmt"
)

// EventSchemaID names the JSON Schema of an Event (schema/event.schema.json).
const EventSchemaID = "ctxpipe.event.v1"

// EventType is the type of an event; it is also the last subject token of
// ctx.events.<conv>.<type>.
type EventType string

// The event types.
const (
	EventCondenseContext         EventType = "condense_context"
	EventSlidingWindowTruncation EventType = "sliding_window_truncation"
	EventContextManaging         EventType = "context_managing"
	EventCondenseFailed          EventType = "condense_failed"
	EventRewind                  EventType = "rewind"
	EventInputRejected           EventType = "input_rejected"
	// EventToolResultsMasked announces an observation masking: older tool
	// results replaced in the effective history by one-line stand-ins.
	EventToolResultsMasked EventType = "tool_results_masked"
	// EventConversationForked announces that a conversation continues
	// another (Turn.ContinuesFrom).
	EventConversationForked EventType = "conversation_forked"
)

// EventHeader is common to every event.
type EventHeader struct {
	ID             string    `json:"id"` // also the Nats-Msg-Id
	Type           EventType `json:"type"`
	ConversationID string    `json:"conversation_id"`
	TS             int64     `json:"ts"`
	InputID        string    `json:"input_id"` // the input that caused it
}

// Event is one of the event structs.
type Event interface {
	Header() *EventHeader
}

// Header returns the common fields.
func (h *EventHeader) Header() *EventHeader { return h }

// EventSubject is the subject an event is published on.
func EventSubject(e Event) string {
	h := e.Header()
	return EventSubjectPrefix + h.ConversationID + "." + string(h.Type)
}

// CondenseContext announces a successful condense.
type CondenseContext struct {
	EventHeader
	CondenseID        string  `json:"condense_id"`
	Summary           string  `json:"summary"`
	Cost              float64 `json:"cost"`
	PrevContextTokens int     `json:"prev_context_tokens"`
	NewContextTokens  int     `json:"new_context_tokens"`
	MessagesCondensed int     `json:"messages_condensed"`
	Trigger           Trigger `json:"trigger"`
	Model             string  `json:"model"`
	Strategy          string  `json:"strategy,omitempty"`
	// Instructions are the manual request's own instructions to the
	// summarizer, when it carried some.
	Instructions string `json:"instructions,omitempty"`
}

// ToolResultsMasked announces an observation masking: the bodies of Count
// older tool results were replaced in the effective history by one-line
// stand-ins naming the tool, its key arguments and the size hidden. The
// stored results are untouched; a rewind to before TS restores them.
type ToolResultsMasked struct {
	EventHeader
	MaskID            string  `json:"mask_id"`
	Count             int     `json:"count"`               // tool results masked
	MessagesMasked    int     `json:"messages_masked"`     // messages given a masked stand-in
	PrevContextTokens int     `json:"prev_context_tokens"` // the context before
	NewContextTokens  int     `json:"new_context_tokens"`  // and after
	Trigger           Trigger `json:"trigger"`
}

// SlidingWindowTruncation announces a truncation. It is never emitted with
// zero messages removed.
type SlidingWindowTruncation struct {
	EventHeader
	TruncationID      string `json:"truncation_id"`
	MessagesRemoved   int    `json:"messages_removed"`
	PrevContextTokens int    `json:"prev_context_tokens"`
	NewContextTokens  int    `json:"new_context_tokens"`
}

// ContextManaging is emitted before a condense starts, so UIs can show
// progress (Roo's willManageContext, Gemini's PreCompress hook).
type ContextManaging struct {
	EventHeader
	Trigger       Trigger `json:"trigger"`
	ContextTokens int     `json:"context_tokens"`
	ContextWindow int     `json:"context_window"`
	Threshold     int     `json:"threshold"`
}

// CondenseFailed announces a condense that did not apply; a truncation may
// follow. With Error ReasonNothingToReduce it ends an overflow that reduced
// nothing at all.
type CondenseFailed struct {
	EventHeader
	Error   Reason  `json:"error"`
	Message string  `json:"message,omitempty"`
	Cost    float64 `json:"cost"`
	Trigger Trigger `json:"trigger"`
	// CondenseError is, with ReasonNothingToReduce after a condense was
	// tried, that condense's own reason (not_enough_messages, say).
	CondenseError Reason `json:"condense_error,omitempty"`
}

// Rewind announces a rewind and what it undid.
type Rewind struct {
	EventHeader
	CutoffTS             int64    `json:"cutoff_ts"`
	IncludeTarget        bool     `json:"include_target"`
	RemovedCondenseIDs   []string `json:"removed_condense_ids"`
	RemovedTruncationIDs []string `json:"removed_truncation_ids"`
	// RemovedMaskIDs are the maskings undone (omitted when none).
	RemovedMaskIDs   []string `json:"removed_mask_ids,omitempty"`
	MessagesRemoved  int      `json:"messages_removed"`
	MessagesRestored int      `json:"messages_restored"`
}

// InputRejected announces an input that was recorded but not applied.
type InputRejected struct {
	EventHeader
	Reason  Reason `json:"reason"`
	Message string `json:"message"`
	Subject string `json:"subject"`
}

// ConversationForked announces that this conversation continues another
// one, whose history the agent's stopped extending (it compacted its
// history itself, or edited an earlier message): the old conversation
// stays as it was, and the agent's history goes on here. It is emitted by
// the first turn that names the conversation it continues.
type ConversationForked struct {
	EventHeader
	// ContinuesFrom is the key of the conversation continued, in the same
	// form as conversation_id (so in the same tenant).
	ContinuesFrom string `json:"continues_from"`
}

// DecodeEvent decodes any event by peeking at its type.
func DecodeEvent(data []byte) (Event, error) {
	var h EventHeader
	if err := json.Unmarshal(data, &h); err != nil {
		return nil, fmt.Errorf("decode event: %w", err)
	}
	var e Event
	switch h.Type {
	case EventCondenseContext:
		e = &CondenseContext{}
	case EventSlidingWindowTruncation:
		e = &SlidingWindowTruncation{}
	case EventContextManaging:
		e = &ContextManaging{}
	case EventCondenseFailed:
		e = &CondenseFailed{}
	case EventRewind:
		e = &Rewind{}
	case EventInputRejected:
		e = &InputRejected{}
	case EventToolResultsMasked:
		e = &ToolResultsMasked{}
	case EventConversationForked:
		e = &ConversationForked{}
	default:
		return nil, fmt.Errorf("decode event: unknown type %q", h.Type)
	}
	if err := json.Unmarshal(data, e); err != nil {
		return nil, fmt.Errorf("decode %s event: %w", h.Type, err)
	}
	return e, nil
}
