package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/internal/backoff"
)

// attemptTimeout bounds one attempt of RetryStart: a JetStream request lost
// in an election is sent again rather than waited for until ctx ends.
var attemptTimeout = 10 * time.Second

// RetryStart runs op, one step of starting against JetStream (ensuring the
// streams, the bucket, the consumer), until it succeeds, fails for good
// (see Transient), or ctx is done; then it returns an error wrapping
// ctx.Err(). Each attempt gets at most attemptTimeout. Each transient
// failure is logged with the wait before the next attempt (backoff as
// ConnectRetry's), and a success after failures is logged too. A broker that
// is up but whose JetStream is not ready yet (a cluster electing its meta
// leader, too few nodes for the replicas) thus delays the start instead of
// failing it.
func RetryStart(ctx context.Context, log *slog.Logger, what string, op func(context.Context) error) error {
	if log == nil {
		log = slog.Default()
	}
	b := backoff.New(startRetry)
	start := time.Now()
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		err := op(actx)
		cancel()
		if err == nil {
			if attempt > 1 {
				log.Info(what+" succeeded", "attempts", attempt, "waited", time.Since(start).Round(time.Millisecond))
			}
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: gave up after %d attempts: %w (last error: %v)", what, attempt, ctx.Err(), err)
		}
		if !Transient(err) {
			return err
		}
		wait := b.Next()
		log.Warn(fmt.Sprintf("%s failed, retrying in %v", what, wait.Round(time.Millisecond)), "attempt", attempt, "err", err)
		if serr := backoff.Sleep(ctx, wait); serr != nil {
			return fmt.Errorf("%s: gave up after %d attempts: %w (last error: %v)", what, attempt, serr, err)
		}
	}
}

// Transient reports whether a JetStream request failed in a way that may go
// away by itself: no answer in time, no responder, a connection being
// re-established, or the server answering 503 (JetStream not ready, the
// cluster without a meta leader, too few nodes up for the replicas). A
// request the server refuses (a bad configuration, a permission) is not.
func Transient(err error) bool {
	var apiErr *jetstream.APIError
	switch {
	case errors.As(err, &apiErr):
		// 503: no quorum, a leader being elected. A placement that failed
		// because a peer is offline (a node restarting, a cluster still
		// forming) clears too; one with too few peers at all does not.
		return apiErr.Code == 503 || strings.Contains(apiErr.Description, "peer offline")
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout),
		errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrNoStreamResponse),
		errors.Is(err, nats.ErrDisconnected), errors.Is(err, nats.ErrConnectionReconnecting):
		return true
	}
	return false
}
