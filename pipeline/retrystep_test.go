package pipeline

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ctxpipe/ctxpipe/changelog"
	"github.com/ctxpipe/ctxpipe/schema"
)

// After a failure of the service a batch of several inputs is split at
// once; a single input is tried again until the retry budget is spent, and
// then rejected as poison, unless the store failed as a whole. A batch
// fenced behind the changelog waits for the follower, whatever its size
// and however long it has been failing.
func TestAfterFailure(t *testing.T) {
	const budget = 30 * time.Second
	busy := errors.New("database is locked")
	down := fmt.Errorf("commit 1 inputs: %w: %w", errStoreDown, busy)
	fenced := fmt.Errorf("commit 2 inputs: %w", errBehind)
	tests := []struct {
		name       string
		err        error
		inputs     int
		failingFor time.Duration
		want       retryStep
	}{
		{"one input, just failed", busy, 1, 0, retryLater},
		{"one input, within the budget", busy, 1, budget - time.Millisecond, retryLater},
		{"one input, at the budget", busy, 1, budget, retryLater},
		{"one input, past the budget", busy, 1, budget + time.Millisecond, retryPoison},
		{"several inputs, just failed", busy, 2, 0, retrySplit},
		{"several inputs, past the budget", busy, 5, 2 * budget, retrySplit},
		{"the store down, past the budget", down, 1, 2 * budget, retryLater},
		{"the store down, several inputs", down, 3, 0, retrySplit},
		{"fenced, several inputs", fenced, 3, 0, retryFollowed},
		{"fenced, past the budget", fenced, 1, 2 * budget, retryFollowed},
	}
	for _, tt := range tests {
		if got := afterFailure(tt.err, tt.inputs, tt.failingFor, budget); got != tt.want {
			t.Errorf("%s: afterFailure = %d, want %d", tt.name, got, tt.want)
		}
	}
}

// A failure that names a reason rejects the input; any other is retried.
func TestRejects(t *testing.T) {
	reasoned := schema.Errorf(schema.ReasonUnknownProfile, "no profile %q", "x")
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"the input's, with a reason", reasoned, true},
		{"the input's, wrapped", fmt.Errorf("apply: %w", reasoned), true},
		{"the store's", errors.New("database is locked"), false},
		{"the changelog moved on", fmt.Errorf("commit 3 inputs: %w", errBehind), false},
	}
	for _, tt := range tests {
		if got := rejects(tt.err); got != tt.want {
			t.Errorf("%s: rejects = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// The waits between retries: 50 ms doubling, capped at 5 s, no jitter.
func TestCommitRetryWaits(t *testing.T) {
	want := []time.Duration{50, 100, 200, 400, 800, 1600, 3200, 5000, 5000}
	for i, w := range want {
		if got := commitRetry.Wait(i + 1); got != w*time.Millisecond {
			t.Errorf("retry %d: wait %v, want %v", i+1, got, w*time.Millisecond)
		}
	}
}

// What a worker does with each way the committer fails its request, as the
// committer words it: fenced, it waits for the follower; the changelog
// unreachable or lost, or the store down, it retries; the store refusing
// the batch, it splits it, or past the budget rejects its input as poison;
// but never for the store down as a whole.
func TestCommitFailuresAfterFailure(t *testing.T) {
	const budget = time.Second
	answer := func(err error) error { return fmt.Errorf("commit 1 inputs: %w", err) }
	tests := []struct {
		name         string
		err          error
		within, past retryStep // one input, within and past the budget
		several      retryStep
	}{
		{"fenced append", answer(appendFailure(fmt.Errorf("append to ctx.state.1: %w", changelog.ErrFenced))), retryFollowed, retryFollowed, retryFollowed},
		{"a view older than the foreign mark", answer(errBehind), retryFollowed, retryFollowed, retryFollowed},
		{"the changelog lost records", answer(appendFailure(changelog.ErrLost)), retryLater, retryPoison, retrySplit},
		{"the changelog unreachable", answer(appendFailure(errors.New("nats: no response from stream"))), retryLater, retryPoison, retrySplit},
		{"the store down", fmt.Errorf("commit 1 inputs: %w: %w", errStoreDown, errors.New("disk I/O error")), retryLater, retryLater, retrySplit},
		{"the store refused the batch", answer(errRefused), retryLater, retryPoison, retrySplit},
	}
	for _, tt := range tests {
		if got := afterFailure(tt.err, 1, 0, budget); got != tt.within {
			t.Errorf("%s, within the budget: %d, want %d", tt.name, got, tt.within)
		}
		if got := afterFailure(tt.err, 1, 2*budget, budget); got != tt.past {
			t.Errorf("%s, past the budget: %d, want %d", tt.name, got, tt.past)
		}
		if got := afterFailure(tt.err, 3, 0, budget); got != tt.several {
			t.Errorf("%s, several inputs: %d, want %d", tt.name, got, tt.several)
		}
	}
}
