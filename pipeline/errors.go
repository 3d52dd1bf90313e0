package pipeline

import (
	"context"
	"errors"

	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/store"
)

// Kind classifies a failure once, at the runner.
type Kind uint8

const (
	// Retry: transient (SQLite busy, a NATS hiccup, a failed read). The worker
	// retries with backoff, up to the retry budget.
	Retry Kind = iota + 1
	// Reject: the input itself is bad; it is recorded with an
	// input_rejected event and acked.
	Reject
	// Stop: shutdown; leave the message for redelivery.
	Stop
)

// KindOf classifies err. Anything unknown is Retry: the retry budget turns a
// "transient" error that never clears into a rejection, so it cannot hold a
// conversation forever.
func KindOf(err error) Kind {
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return Stop
	case schema.ReasonOf(err) != "":
		return Reject
	case store.IsTransient(err):
		return Retry
	}
	return Retry
}
