package condense

import (
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Error classes. Every error Summarize returns (other than a cancelled
// caller's context, which is returned wrapped as is) matches at most one of
// these with errors.Is, and an HTTP failure is also an *APIError:
//
//	errors.Is(err, condense.ErrRateLimited) // 429 (retried)
//	errors.Is(err, condense.ErrServer)      // 5xx (retried)
//	errors.Is(err, condense.ErrNetwork)     // connection failures (retried)
//	errors.Is(err, condense.ErrTimeout)     // one attempt took longer than its timeout (retried)
//	errors.Is(err, condense.ErrBadResponse) // 2xx whose body is not a chat completion (not retried)
//	errors.Is(err, condense.ErrEmptySummary)
//	var apiErr *condense.APIError; errors.As(err, &apiErr) // any HTTP error status; apiErr.StatusCode
//
// Use Retryable to ask whether a class is worth retrying.
var (
	ErrRateLimited  = errors.New("rate limited")
	ErrServer       = errors.New("server error")
	ErrNetwork      = errors.New("network error")
	ErrTimeout      = errors.New("attempt timed out")
	ErrBadResponse  = errors.New("malformed response")
	ErrEmptySummary = errors.New("empty summary")
)

// APIError is an HTTP error status from the endpoint.
type APIError struct {
	StatusCode int
	// Message is the provider's error message, or the status text.
	Message string
	// RetryAfter is the parsed Retry-After header; 0 when absent.
	RetryAfter time.Duration
	// Err is the client library's error.
	Err error
}

func (e *APIError) Error() string {
	return fmt.Sprintf("status %d: %s", e.StatusCode, e.Message)
}

// Unwrap returns the client library's error.
func (e *APIError) Unwrap() error { return e.Err }

// Is makes a 429 match ErrRateLimited and a 5xx match ErrServer.
func (e *APIError) Is(target error) bool {
	switch target {
	case ErrRateLimited:
		return e.StatusCode == http.StatusTooManyRequests
	case ErrServer:
		return e.StatusCode >= 500
	}
	return false
}

// Retryable reports whether err is a transient failure worth another
// attempt: a 429, a 5xx, a network failure or an attempt timeout. Other 4xx,
// malformed responses and empty summaries are not retried: the same request
// would fail the same way.
func Retryable(err error) bool {
	return errors.Is(err, ErrRateLimited) || errors.Is(err, ErrServer) ||
		errors.Is(err, ErrNetwork) || errors.Is(err, ErrTimeout)
}
