package client

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/schema"
)

// Append publishes a turn to ctx.in.<conv>.turn and returns its id once
// JetStream has stored it (the PubAck came back). An empty ID is filled
// with a new UUID and a zero TS with the current time. Publishing the same
// turn again is harmless: the stream drops a copy the client's connection
// sends again inside its duplicate window (bus.MsgID), and the service,
// which applies an input id once per tenant, any other.
//
// Append does not validate the turn beyond its conversation id (which must
// make a safe subject) and its id: the service is the authority, and rejects
// a bad turn with an input_rejected event that Wait reports as a
// *RejectedError. An id that is not a UUID is refused here instead: the
// service could only record its rejection under another id, which Wait
// could not find.
func (c *Client) Append(ctx context.Context, turn schema.Turn) (string, error) {
	if turn.ID == "" {
		turn.ID = uuid.NewString()
	}
	if _, err := uuid.Parse(turn.ID); err != nil || len(turn.ID) != 36 {
		return "", &RejectedError{InputID: turn.ID, ConversationID: turn.ConversationID, Reason: schema.ReasonBadID,
			Message: fmt.Sprintf("id %q is not a UUID in its 36-character form", turn.ID)}
	}
	if turn.TS == 0 {
		turn.TS = time.Now().UnixMilli()
	}
	data, err := schema.Marshal(turn)
	if err != nil {
		return "", fmt.Errorf("ctxpipe append to %s: %w", turn.ConversationID, err)
	}
	return turn.ID, c.publish(ctx, turn.ConversationID, schema.KindTurn, turn.ID, data)
}

// Condense asks for a condense of conv now, without the threshold check
// (Roo's button, Gemini's /compress), and returns the input's id: Wait for
// it, or watch Events for condense_context or condense_failed. instructions
// ("" for none; at most schema.MaxInstructionsLen characters) go to the
// summarizer with this condense only, e.g. "keep the failing test names".
func (c *Client) Condense(ctx context.Context, conv, instructions string) (string, error) {
	return c.control(ctx, conv, schema.Input{Kind: schema.KindCondense, Trigger: schema.TriggerManual, Instructions: instructions})
}

// Overflow reports that the model's provider answered "context window
// exceeded" for conv: the service reduces the context by force (a condense
// to 75 %, a truncation if that fails). Its events end in a reduction, or
// in condense_failed with nothing_to_reduce when nothing could be reduced
// (the same request would overflow again). It returns the input's id.
func (c *Client) Overflow(ctx context.Context, conv string) (string, error) {
	return c.control(ctx, conv, schema.Input{Kind: schema.KindOverflow})
}

// Rewind undoes conv back to ts (Unix ms; the ts of a stored message, from
// the full history): the messages from ts on are removed, except the one at
// exactly ts when includeTarget is set (MessageManager.rewindToTimestamp),
// and every condense and truncation at or after ts is undone, so the
// messages they hid come back exactly. It returns the input's id.
func (c *Client) Rewind(ctx context.Context, conv string, ts int64, includeTarget bool) (string, error) {
	if ts <= 0 {
		return "", &RejectedError{ConversationID: conv, Reason: schema.ReasonBadTS, Message: "ts must be a positive Unix time in milliseconds"}
	}
	return c.control(ctx, conv, schema.Input{Kind: schema.KindRewind, TS: ts, IncludeTarget: includeTarget})
}

// Pin pins (pinned true) or unpins the stored message messageID of conv
// (its id, from the full history): a pinned message stays verbatim in the
// effective history through every reduction. A pin emits no event; Wait for
// the returned input id to learn it applied (a rejection, unknown_target,
// names no stored message of conv).
func (c *Client) Pin(ctx context.Context, conv, messageID string, pinned bool) (string, error) {
	if messageID == "" {
		return "", &RejectedError{ConversationID: conv, Reason: schema.ReasonUnknownTarget, Message: "a message id is required"}
	}
	return c.control(ctx, conv, schema.Input{Kind: schema.KindPin, MessageID: messageID, Pinned: pinned})
}

func (c *Client) control(ctx context.Context, conv string, in schema.Input) (string, error) {
	in.ID, in.ConversationID = uuid.NewString(), conv
	if in.TS == 0 {
		in.TS = time.Now().UnixMilli()
	}
	data, err := schema.ControlPayload(in)
	if err != nil {
		return "", fmt.Errorf("ctxpipe %s of %s: %w", in.Kind, conv, err)
	}
	return in.ID, c.publish(ctx, conv, in.Kind, in.ID, data)
}

// publish sends one input and waits for its PubAck. A publish the server
// refuses (a user who may not send this kind of input) gets no ack, only an
// asynchronous -ERR: publish watches for it, so it fails at once with the
// server's reason (nats.ErrPermissionViolation) instead of at the timeout.
func (c *Client) publish(ctx context.Context, conv string, kind schema.InputKind, id string, data []byte) error {
	if !schema.ValidConversationID(conv) {
		// Refused here, as the service would: "a.b" would be read as
		// tenant a's conversation b.
		return &RejectedError{InputID: id, ConversationID: conv, Reason: schema.ReasonBadConversationID,
			Message: fmt.Sprintf("conversation id %q must be 1-128 characters of [A-Za-z0-9_-], not starting with _", conv)}
	}
	ctx, cancel := c.bound(ctx, 0)
	defer cancel()
	subject := schema.InputSubject(c.scoped(conv), kind)
	before := c.nc.LastError()
	refused := func() error {
		// Only a violation that came after the publish started: the
		// connection's last error may be an old one.
		err := c.nc.LastError()
		if !sameError(err, before) && errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), `Publish to "`+subject+`"`) {
			return err
		}
		return nil
	}
	done := make(chan error, 1)
	go func() {
		_, err := bus.PublishInput(ctx, c.js, subject, id, data)
		done <- err
	}()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			if err != nil {
				if p := refused(); p != nil {
					err = p
				}
				return fmt.Errorf("ctxpipe %s: %w", kind, err)
			}
			return nil
		case <-tick.C:
			if p := refused(); p != nil {
				cancel()
				<-done
				return fmt.Errorf("ctxpipe %s: %w", kind, p)
			}
		}
	}
}

// sameError reports whether a and b are the same error value; == would
// panic on a dynamic type that is not comparable.
func sameError(a, b error) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	ta, tb := reflect.TypeOf(a), reflect.TypeOf(b)
	return ta == tb && ta.Comparable() && a == b
}
