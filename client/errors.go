package client

import (
	"errors"
	"fmt"
	"strings"

	"github.com/ctxpipe/ctxpipe/schema"
)

// Sentinels to test errors against with errors.Is. A *QueryError matches the
// one of its code; a *RejectedError matches ErrRejected.
var (
	ErrNotFound   = errors.New("ctxpipe: no such conversation")       // not_found
	ErrTimeout    = errors.New("ctxpipe: input not applied in time")  // timeout: a wait_for ran out
	ErrBadRequest = errors.New("ctxpipe: bad request")                // bad_request
	ErrTooLarge   = errors.New("ctxpipe: reply too large")            // too_large: ask for smaller pages
	ErrForbidden  = errors.New("ctxpipe: reply subject refused")      // forbidden
	ErrInternal   = errors.New("ctxpipe: service failed")             // internal: retrying may help
	ErrRejected   = errors.New("ctxpipe: input rejected")             // the input was recorded but not applied
	ErrNoService  = errors.New("ctxpipe: no service answers queries") // nobody subscribes to ctx.q.<verb>
	// ErrStaleCursor: a history cursor no longer continues the view (a
	// condense, truncation or rewind changed it since): read from the start.
	ErrStaleCursor = errors.New("ctxpipe: history cursor is stale")
)

var codeSentinel = map[schema.QueryCode]error{
	schema.QueryNotFound:   ErrNotFound,
	schema.QueryTimeout:    ErrTimeout,
	schema.QueryBadRequest: ErrBadRequest,
	schema.QueryTooLarge:   ErrTooLarge,
	schema.QueryForbidden:  ErrForbidden,
	schema.QueryInternal:   ErrInternal,
}

// QueryError is a query the service answered with {"error":{"code",
// "message"}}, or one the client refused to send because the service would
// have (code bad_request).
type QueryError struct {
	Verb           schema.QueryVerb // history, status or events
	ConversationID string
	Code           schema.QueryCode
	Message        string
}

func (e *QueryError) Error() string {
	return fmt.Sprintf("ctxpipe %s %s: %s: %s", e.Verb, e.ConversationID, e.Code, e.Message)
}

// Is reports whether target is the sentinel of e's code, so that
// errors.Is(err, client.ErrNotFound) needs no type assertion.
func (e *QueryError) Is(target error) bool {
	s, ok := codeSentinel[e.Code]
	return ok && s == target
}

// RejectedError is an input the service recorded but did not apply: an
// input_rejected event says why. Reason is the stable code (bad_role,
// unknown_profile, duplicate_id, ...); Message is for people.
type RejectedError struct {
	InputID        string
	ConversationID string
	Reason         schema.Reason
	Message        string
}

func (e *RejectedError) Error() string {
	s := fmt.Sprintf("ctxpipe: input %s of %s rejected: %s", e.InputID, e.ConversationID, e.Reason)
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// Is reports whether target is ErrRejected.
func (e *RejectedError) Is(target error) bool { return target == ErrRejected }

// queryError converts a reply's error body.
func queryError(verb schema.QueryVerb, conv string, body *schema.QueryErrorBody) *QueryError {
	return &QueryError{Verb: verb, ConversationID: conv, Code: body.Code, Message: body.Message}
}

// rejectedReason reads the reason code out of the message of an
// input_rejected query error ("input <id> was rejected: <reason>"); the
// code is the last word, as pipeline.waitFor writes it.
func rejectedReason(msg string) schema.Reason {
	i := strings.LastIndex(msg, ": ")
	if i < 0 {
		return ""
	}
	return schema.Reason(strings.TrimSpace(msg[i+2:]))
}

// badConversation is the client's own refusal of a conversation id that is
// not a subject token: published as is it could land on another
// conversation's subject (a.b is tenant a's conversation b).
func badConversation(verb schema.QueryVerb, conv string) error {
	if schema.ValidConversationID(conv) {
		return nil
	}
	return &QueryError{Verb: verb, ConversationID: conv, Code: schema.QueryBadRequest,
		Message: fmt.Sprintf("conversation id %q must be 1-128 characters of [A-Za-z0-9_-], not starting with _", conv)}
}
