package schema

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// Query subjects (request/reply, served by ctxpipe in its queue group).
const (
	SubjectHistory = "ctx.q.history"
	SubjectStatus  = "ctx.q.status"
	SubjectEvents  = "ctx.q.events"
	// QuerySubjectPrefix covers every query subject (ctx.q.>).
	QuerySubjectPrefix = "ctx.q."
)

// View selects which messages ctx.q.history returns.
type View string

// The history views.
const (
	// ViewEffective is what an agent sends to its model (getEffectiveApiHistory).
	ViewEffective View = "effective"
	// ViewFull is every stored message with its tags, hidden ones included.
	ViewFull View = "full"
)

// QueryCode is a stable, machine-readable code in a failed query's reply.
type QueryCode string

// Query error codes.
const (
	QueryBadRequest QueryCode = "bad_request" // the request could not be decoded or failed validation
	QueryNotFound   QueryCode = "not_found"   // no such conversation
	QueryTimeout    QueryCode = "timeout"     // wait_for did not become readable within timeout_ms
	QueryInternal   QueryCode = "internal"    // the service failed; retrying may help
	QueryTooLarge   QueryCode = "too_large"   // the reply would not fit in one message: ask for a smaller page
	QueryForbidden  QueryCode = "forbidden"   // the request's reply subject is outside an inbox prefix
	// QueryInputRejected answers a history query whose wait_for input was
	// rejected: the agent learns its turn did not land, and why.
	QueryInputRejected QueryCode = "input_rejected"
)

// MaxQueryTimeout bounds a request's timeout_ms, so that a client cannot park
// a responder goroutine for ever. A larger timeout_ms is not an error: it
// waits MaxQueryTimeout. A negative one is bad_request.
const MaxQueryTimeout = 60 * time.Second

// HistorySchemaID names the JSON Schema of a ctx.q.history request and
// reply (schema/history.schema.json: #/$defs/request, #/$defs/reply).
const HistorySchemaID = "ctxpipe.history.v1"

// HistoryRequest is the body of a ctx.q.history request.
type HistoryRequest struct {
	ConversationID string `json:"conversation_id"`
	View           View   `json:"view,omitempty"`
	// WaitFor is an input id: the reply waits until that input has been
	// applied, so an agent can publish a turn and read the history holding it.
	WaitFor   string `json:"wait_for,omitempty"`
	TimeoutMS int64  `json:"timeout_ms,omitempty"`
	// Limit caps the messages in one reply (0: all of them, if they fit in
	// one NATS message; otherwise the reply is a too_large error). A reply
	// that stops early carries next_cursor.
	Limit int `json:"limit,omitempty"`
	// Cursor continues a paged read: the next_cursor of the previous reply.
	Cursor string `json:"cursor,omitempty"`
	// After makes the read incremental: it is the seq of the previous
	// reply for this conversation and view. When nothing but turns were
	// appended since (no condense, truncation, mask, pin or rewind), the
	// reply holds only the messages of the view stored after that seq (none
	// when nothing changed); otherwise it is the whole view, marked
	// reset: true, and the client replaces what it holds. 0 reads the whole
	// view. After cannot be combined with limit or cursor (bad_request): a
	// client pages without it and then goes on with the seq of its last
	// page.
	After int64 `json:"after,omitempty"`
}

// MaxHistoryLimit bounds a history request's limit.
const MaxHistoryLimit = 100_000

// Validate checks the request and fills the default view ("effective").
// A non-nil error is a *QueryErrorBody with code bad_request.
func (r *HistoryRequest) Validate() error {
	if err := queryConversationID(r.ConversationID); err != nil {
		return err
	}
	switch r.View {
	case "":
		r.View = ViewEffective
	case ViewEffective, ViewFull:
	default:
		return QueryErrorf(QueryBadRequest, "view must be %q or %q, got %q", ViewEffective, ViewFull, r.View)
	}
	if r.WaitFor != "" {
		if _, err := uuid.Parse(r.WaitFor); err != nil || len(r.WaitFor) != 36 {
			return QueryErrorf(QueryBadRequest, "wait_for %q is not an input id (UUID)", r.WaitFor)
		}
		r.WaitFor = CanonicalID(r.WaitFor)
	}
	if r.TimeoutMS < 0 {
		return QueryErrorf(QueryBadRequest, "timeout_ms must not be negative")
	}
	if r.Limit < 0 || r.Limit > MaxHistoryLimit {
		return QueryErrorf(QueryBadRequest, "limit must be in [0, %d], got %d", MaxHistoryLimit, r.Limit)
	}
	if len(r.Cursor) > 256 {
		return QueryErrorf(QueryBadRequest, "cursor is not one this service returned")
	}
	if r.After < 0 {
		return QueryErrorf(QueryBadRequest, "after must not be negative")
	}
	if r.After > 0 && (r.Limit != 0 || r.Cursor != "") {
		return QueryErrorf(QueryBadRequest, "after cannot be combined with limit or cursor: page without it, then go on with the last page's seq")
	}
	return nil
}

// Timeout is how long a wait_for may wait: timeout_ms, or def when it is
// unset, capped at MaxQueryTimeout. timeout_ms is capped before it becomes a
// Duration: 1e13 ms in nanoseconds does not fit in an int64 and would wrap
// to a negative, that is instant, timeout.
func (r *HistoryRequest) Timeout(def time.Duration) time.Duration {
	d := def
	if r.TimeoutMS > 0 {
		d = time.Duration(min(r.TimeoutMS, MaxQueryTimeout.Milliseconds())) * time.Millisecond
	}
	return max(min(d, MaxQueryTimeout), 0)
}

// HistoryReply is the reply to ctx.q.history.
type HistoryReply struct {
	ConversationID string    `json:"conversation_id"`
	View           View      `json:"view"`
	Messages       []Message `json:"messages"`
	// Total is how many messages the whole view holds; set on paged replies.
	Total int `json:"total,omitempty"`
	// NextCursor, when set, reads the next page (the request's cursor).
	NextCursor string `json:"next_cursor,omitempty"`
	// Seq is the conversation's change sequence this reply was read at:
	// the after of the next incremental read. Every commit that changes the
	// conversation's messages or tags takes it one step.
	Seq int64 `json:"seq,omitempty"`
	// Reset is set on a reply to an incremental read (after > 0) that holds
	// the whole view, because it changed in other ways than appends since.
	// An incremental reply without it holds only the messages appended.
	Reset bool `json:"reset,omitempty"`
}

// QueryVerb is the last token of a query subject: history, status, events.
type QueryVerb string

// The queries.
const (
	VerbHistory QueryVerb = "history"
	VerbStatus  QueryVerb = "status"
	VerbEvents  QueryVerb = "events"
)

// QuerySubject is the subject the service answers verb on for tenant: the
// server maps a tenant's ctx.q.<verb> onto ctx.q.<tenant>.<verb>; "" is the
// service's own account.
func QuerySubject(tenant string, verb QueryVerb) string {
	if tenant == "" {
		return QuerySubjectPrefix + string(verb)
	}
	return QuerySubjectPrefix + tenant + "." + string(verb)
}

// EventsRequest is the body of a ctx.q.events request: a conversation's
// events as committed, oldest first, for a UI or a rewind consumer that
// replays them (live ones arrive on ctx.events.<conv>.<type>).
type EventsRequest struct {
	ConversationID string `json:"conversation_id"`
	// After skips the first After events (the previous reply's next).
	After int `json:"after,omitempty"`
	// Limit caps the events in one reply (0: up to MaxEventsLimit).
	Limit int `json:"limit,omitempty"`
}

// MaxEventsLimit bounds one ctx.q.events reply.
const MaxEventsLimit = 1000

// Validate checks the request and fills the default limit.
func (r *EventsRequest) Validate() error {
	if err := queryConversationID(r.ConversationID); err != nil {
		return err
	}
	if r.After < 0 || r.Limit < 0 || r.Limit > MaxEventsLimit {
		return QueryErrorf(QueryBadRequest, "after must be ≥ 0 and limit in [0, %d]", MaxEventsLimit)
	}
	if r.Limit == 0 {
		r.Limit = MaxEventsLimit
	}
	return nil
}

// EventsReply is the reply to ctx.q.events. Next is the After of the next
// page; More says whether there is one.
type EventsReply struct {
	ConversationID string            `json:"conversation_id"`
	Events         []json.RawMessage `json:"events"`
	Next           int               `json:"next"`
	More           bool              `json:"more"`
}

// StatusRequest is the body of a ctx.q.status request.
type StatusRequest struct {
	ConversationID string `json:"conversation_id"`
}

// Validate checks the request. A non-nil error is a *QueryErrorBody.
func (r *StatusRequest) Validate() error {
	if err := queryConversationID(r.ConversationID); err != nil {
		return err
	}
	return nil
}

// StatusReply is the reply to ctx.q.status: where a conversation stands
// against its profile's window and threshold.
type StatusReply struct {
	ConversationID string `json:"conversation_id"`
	ProfileID      string `json:"profile_id"`
	// ContextTokens is the effective context's size.
	ContextTokens int `json:"context_tokens"`
	ContextWindow int `json:"context_window"`
	// AllowedTokens is the window minus the reply reserve (Roo's allowedTokens).
	AllowedTokens int `json:"allowed_tokens"`
	// Percent is ContextTokens as a percentage of ContextWindow.
	Percent float64 `json:"percent"`
	// Threshold is the condense threshold in percent in force for the profile.
	Threshold      int `json:"threshold"`
	Messages       int `json:"messages"`
	HiddenMessages int `json:"hidden_messages"`
	Condensations  int `json:"condensations"`
	Truncations    int `json:"truncations"`
}

// QueryError is the reply to a failed query: {"error":{"code","message"}}.
type QueryError struct {
	Error QueryErrorBody `json:"error"`
}

// QueryErrorBody is a failed query's code and message. It is an error, so a
// responder can return it from validation and a client from DecodeQueryReply.
type QueryErrorBody struct {
	Code    QueryCode `json:"code"`
	Message string    `json:"message"`
}

func (e *QueryErrorBody) Error() string { return string(e.Code) + ": " + e.Message }

// QueryErrorf returns a *QueryErrorBody with a formatted message.
func QueryErrorf(code QueryCode, format string, args ...any) *QueryErrorBody {
	return &QueryErrorBody{Code: code, Message: fmt.Sprintf(format, args...)}
}

// MarshalQueryError encodes the error reply for code and message.
func MarshalQueryError(code QueryCode, message string) []byte {
	b, err := Marshal(QueryError{Error: QueryErrorBody{Code: code, Message: message}})
	if err != nil { // cannot happen: two strings
		panic(err)
	}
	return b
}

// DecodeQueryReply decodes a query reply into v. A reply that carries an
// "error" object comes back as a *QueryErrorBody error and v is left alone.
func DecodeQueryReply(data []byte, v any) error {
	// An error reply is small; a long reply is a history whose first field
	// is conversation_id, so it need not be scanned twice (or at all, for a
	// caller that passes v == nil to learn only whether it succeeded).
	if len(data) < 4096 || bytes.HasPrefix(bytes.TrimLeft(data, " \t\r\n"), []byte(`{"error"`)) {
		var probe struct {
			Error *QueryErrorBody `json:"error"`
		}
		if err := json.Unmarshal(data, &probe); err != nil {
			return fmt.Errorf("decode query reply: %w", err)
		}
		if probe.Error != nil {
			return probe.Error
		}
	}
	if v == nil {
		return nil
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("decode query reply: %w", err)
	}
	return nil
}

// queryConversationID checks a query's conversation_id: a bad one is a
// *QueryErrorBody with code bad_request.
func queryConversationID(id string) error {
	if !ValidConversationID(id) {
		return QueryErrorf(QueryBadRequest, "conversation_id %q %s", id, convIDRule)
	}
	return nil
}
