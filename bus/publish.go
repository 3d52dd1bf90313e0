package bus

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrNotInput is returned by PublishInput for a subject outside ctx.in.>.
var ErrNotInput = errors.New("not an input subject (ctx.in.<conv>.<kind>)")

// PublishInput publishes one input to CTX_IN and waits for the PubAck. id is
// the input's own id; it goes into the Nats-Msg-Id header so that JetStream
// drops a re-sent copy inside its duplicate window (the ack then reports
// Duplicate) and ctxpipe drops it after.
func PublishInput(ctx context.Context, js jetstream.JetStream, subject, id string, data []byte) (*jetstream.PubAck, error) {
	if !strings.HasPrefix(subject, "ctx.in.") {
		return nil, fmt.Errorf("publish %s: %w", subject, ErrNotInput)
	}
	if id == "" {
		return nil, fmt.Errorf("publish %s: an input needs an id", subject)
	}
	ack, err := js.Publish(ctx, subject, data, jetstream.WithMsgID(id), jetstream.WithExpectStream(StreamIn))
	if err != nil {
		return nil, fmt.Errorf("publish %s (id %s): %w", subject, id, err)
	}
	return ack, nil
}
