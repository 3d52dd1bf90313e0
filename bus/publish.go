package bus

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/internal/backoff"
)

// ErrNotInput is returned by PublishInput for a subject outside ctx.in.>, or
// one with an empty token or a token that is a wildcard ('*', '>'): the
// server would store such an input where no partition reads it (Reached).
var ErrNotInput = errors.New("not an input subject (ctx.in.<conv>.<kind>)")

// PublishRetryFor bounds how long PublishInput retries a publish that
// found no stream leader to answer (a cluster electing one after a node
// loss takes up to about 10 s).
const PublishRetryFor = 15 * time.Second

// msgIDKey is the random part of this process's Nats-Msg-Ids (MsgID).
var msgIDKey = rand.Text()

// MsgID is the Nats-Msg-Id ctxpipe's publishers give input inputID sent on
// subject over nc: the id, the subject, and a part no other client can
// know, this process's random key with nc's client id on the server. The
// server keys a stream's duplicate window by the header alone, so the
// window is one namespace for every tenant: a Nats-Msg-Id another tenant
// can know (the bare input id, when ids are predictable) lets that tenant
// drop the input as a duplicate inside the window, and tells it that the id
// was just used. This one nobody else can name, while a copy the same
// connection sends again (a retry, or the same input published twice) is
// still dropped inside the window. The service applies an input id once per
// tenant in any case.
func MsgID(nc *nats.Conn, subject, inputID string) string {
	cid, _ := nc.GetClientID()
	return fmt.Sprintf("%s/%s/%s-%d", inputID, subject, msgIDKey, cid)
}

// publishRetry is PublishInput's backoff: from 100 ms doubling to 1 s.
var publishRetry = backoff.Policy{First: 100 * time.Millisecond, Max: time.Second}

// PublishInput publishes one input to CTX_IN and waits for the PubAck. id is
// the input's own id; MsgID makes the Nats-Msg-Id of it, so that JetStream
// drops a copy the connection sends again inside its duplicate window (the
// ack then reports Duplicate) and ctxpipe drops it after. That makes
// retrying safe: while the stream has no leader to answer (Transient
// errors), it retries with backoff for up to PublishRetryFor, or until ctx
// ends.
func PublishInput(ctx context.Context, js jetstream.JetStream, subject, id string, data []byte) (*jetstream.PubAck, error) {
	if !inputSubject(subject) {
		return nil, fmt.Errorf("publish %s: %w", subject, ErrNotInput)
	}
	if id == "" {
		return nil, fmt.Errorf("publish %s: an input needs an id", subject)
	}
	start, b := time.Now(), backoff.New(publishRetry)
	for {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ack, err := js.Publish(actx, subject, data, jetstream.WithMsgID(MsgID(js.Conn(), subject, id)), jetstream.WithExpectStream(StreamIn))
		cancel()
		if err == nil {
			return ack, nil
		}
		wait := b.Next()
		if !Transient(err) || ctx.Err() != nil || time.Since(start)+wait > PublishRetryFor {
			return nil, fmt.Errorf("publish %s (id %s): %w", subject, id, err)
		}
		if backoff.Sleep(ctx, wait) != nil {
			return nil, fmt.Errorf("publish %s (id %s): %w", subject, id, err)
		}
	}
}

// inputSubject reports whether subject is under ctx.in. with literal,
// non-empty tokens.
func inputSubject(subject string) bool {
	rest, ok := strings.CutPrefix(subject, "ctx.in.")
	if !ok {
		return false
	}
	for t := range strings.SplitSeq(rest, ".") {
		if t == "" || t == "*" || t == ">" {
			return false
		}
	}
	return true
}
