// Package backoff is ctxpipe's one capped exponential backoff: the wait
// before each retry of something that may succeed when tried again (a
// connection, a JetStream request, a summarizer call, a query). Policy says
// how waits grow; Backoff walks a Policy retry by retry; Sleep waits one
// out unless a context ends first.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Policy is a capped exponential backoff: the first step is First, each
// next one doubles, up to Max.
type Policy struct {
	First, Max time.Duration
	// Jitter draws each wait uniformly from the upper half of its step
	// ("equal jitter"), so that callers that failed together do not retry
	// in step; without it a wait is its step.
	Jitter bool
}

// Step is the step of retry number n (1 for the first): First doubled n−1
// times, never over Max. A Max under First caps at Max; n below 1 is 1.
func (p Policy) Step(n int) time.Duration {
	d := p.First
	for i := 1; i < n && d < p.Max; i++ {
		d *= 2
	}
	return min(d, p.Max)
}

// Wait is the wait before retry number n: Step(n), or with Jitter a
// uniform draw from [Step(n)/2, Step(n)].
func (p Policy) Wait(n int) time.Duration {
	d := p.Step(n)
	if !p.Jitter || d <= 0 {
		return d
	}
	half := d / 2
	return half + rand.N(d-half+1)
}

// Backoff walks a Policy: each Next is the wait before the next retry, and
// Reset starts again from the first.
type Backoff struct {
	Policy
	n int // retries so far
}

// New returns a Backoff at its first retry.
func New(p Policy) *Backoff { return &Backoff{Policy: p} }

// Next is the wait before the next retry, and counts that retry.
func (b *Backoff) Next() time.Duration {
	b.n++
	return b.Wait(b.n)
}

// Reset makes the next wait the first again, after a success.
func (b *Backoff) Reset() { b.n = 0 }

// Sleep waits d, or until ctx is done: it returns nil after the wait and
// ctx's error when ctx ended it. A wait of 0 or less returns ctx's error at
// once (nil while ctx lasts).
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
