package pipeline

import (
	"context"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/schema"
)

// JetStreamPublisher publishes outbox rows to CTX_EVENTS with the event id as
// Nats-Msg-Id, so a row published twice (a crash between publish and mark)
// is dropped by the stream. It implements store.Publisher.
type JetStreamPublisher struct{ JS jetstream.JetStream }

// Publish sends one event and waits for the stream's ack.
func (p JetStreamPublisher) Publish(ctx context.Context, subject string, data []byte, msgID string) error {
	_, err := p.JS.Publish(ctx, subject, data, jetstream.WithMsgID(msgID))
	return err
}

// ProgressPublisher returns an Engine.Progress func that publishes the
// context_managing event as soon as a condense starts, while the summarizer
// runs. The same event is also committed to the outbox with the same id;
// the stream's duplicate window drops the second copy, and if this publish
// fails the outbox still delivers it.
func ProgressPublisher(js jetstream.JetStream, log *slog.Logger) func(context.Context, schema.Event) {
	return func(ctx context.Context, ev schema.Event) {
		data, err := schema.Marshal(ev)
		if err == nil {
			_, err = js.Publish(ctx, schema.EventSubject(ev), data, jetstream.WithMsgID(ev.Header().ID))
		}
		if err != nil {
			log.Warn("progress event not published now; the outbox will deliver it", "event", ev.Header().ID, "err", err)
		}
	}
}
