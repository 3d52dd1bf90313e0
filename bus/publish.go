package bus

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrNotInput is returned by PublishInput for a subject outside ctx.in.>.
var ErrNotInput = errors.New("not an input subject (ctx.in.<conv>.<kind>)")

// PublishRetryFor bounds how long PublishInput retries a publish that
// found no stream leader to answer (a cluster electing one after a node
// loss takes up to about 10 s).
const PublishRetryFor = 15 * time.Second

// PublishInput publishes one input to CTX_IN and waits for the PubAck. id is
// the input's own id; it goes into the Nats-Msg-Id header so that JetStream
// drops a re-sent copy inside its duplicate window (the ack then reports
// Duplicate) and ctxpipe drops it after. That makes retrying safe: while
// the stream has no leader to answer (Transient errors), it retries with
// backoff for up to PublishRetryFor, or until ctx ends.
func PublishInput(ctx context.Context, js jetstream.JetStream, subject, id string, data []byte) (*jetstream.PubAck, error) {
	if !strings.HasPrefix(subject, "ctx.in.") {
		return nil, fmt.Errorf("publish %s: %w", subject, ErrNotInput)
	}
	if id == "" {
		return nil, fmt.Errorf("publish %s: an input needs an id", subject)
	}
	start, wait := time.Now(), 100*time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ack, err := js.Publish(actx, subject, data, jetstream.WithMsgID(id), jetstream.WithExpectStream(StreamIn))
		cancel()
		if err == nil {
			return ack, nil
		}
		if !Transient(err) || ctx.Err() != nil || time.Since(start)+wait > PublishRetryFor {
			return nil, fmt.Errorf("publish %s (id %s): %w", subject, id, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("publish %s (id %s): %w", subject, id, err)
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}
