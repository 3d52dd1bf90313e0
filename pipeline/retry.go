package pipeline

import (
	"errors"
	"time"

	"github.com/ctxpipe/ctxpipe/internal/backoff"
	"github.com/ctxpipe/ctxpipe/schema"
)

// A batch's prepare or commit fails in one of two ways. A failure that
// names a reason (schema.Error) is the input's: it is rejected, recorded
// with an input_rejected event, and never tried again. Any other failure is
// the service's (the store busy or failing, the changelog fenced or
// unreachable, the profiles bucket or the summarizer down): the worker
// keeps the batch and tries again, with backoff, until the retry budget is
// spent; a batch of several inputs is split at the first failure, so that
// one bad input cannot hold back the others, and a single input that keeps
// failing past the budget is rejected as poison, unless the store failed
// as a whole (errStoreDown): that is never the input's doing. A batch
// fenced behind a record in the changelog the store lacks (errBehind) is
// not its inputs' doing either: it is prepared again once the follower has
// applied that record, neither split nor poisoned, however long that takes.

// commitRetry is the wait before each retry of a failed batch.
var commitRetry = backoff.Policy{First: 50 * time.Millisecond, Max: 5 * time.Second}

// behindWait bounds a fenced batch's wait for the follower: past it the
// batch is prepared again anyway (the fence then tells whether the wait is
// over).
const behindWait = time.Second

// rejects tells whether err rejects the input (it names a reason) rather
// than failing the attempt.
func rejects(err error) bool { return schema.ReasonOf(err) != "" }

// retryStep is what a worker does with a batch after a failure of the
// service.
type retryStep uint8

const (
	// retryLater tries the batch again after the backoff.
	retryLater retryStep = iota
	// retryFollowed prepares the batch again once the follower has applied
	// the partition's record it was fenced behind (or after behindWait).
	retryFollowed
	// retrySplit handles each input of the batch alone, in order.
	retrySplit
	// retryPoison rejects the single input as poison (and tries again
	// later should even that not commit).
	retryPoison
)

// afterFailure decides the next step for a batch of inputs that failed with
// err and has been failing for failingFor, given the retry budget.
func afterFailure(err error, inputs int, failingFor, budget time.Duration) retryStep {
	switch {
	case errors.Is(err, errBehind):
		return retryFollowed
	case inputs > 1:
		return retrySplit
	case failingFor > budget && !errors.Is(err, errStoreDown):
		return retryPoison
	}
	return retryLater
}
