package bus_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/internal/natstest"
)

// A publish that finds no stream to answer (a cluster electing a leader, or
// CTX_IN not there yet) is retried, with the same Nats-Msg-Id, until the
// stream answers: the agent's turn is not lost to a node loss.
func TestPublishInputWaitsForTheStream(t *testing.T) {
	_, url := natstest.Run(t)
	js, err := jetstream.New(natstest.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	go func() {
		time.Sleep(700 * time.Millisecond)
		if err := bus.EnsureStreams(ctx, js); err != nil {
			t.Error(err)
		}
	}()
	id := uuid.NewString()
	ack, err := bus.PublishInput(ctx, js, "ctx.in.c1.turn", id, []byte(`{}`))
	if err != nil {
		t.Fatalf("publish before the stream existed: %v", err)
	}
	if ack.Stream != bus.StreamIn || ack.Duplicate {
		t.Fatalf("ack %+v", ack)
	}
	// A bounded context still bounds it.
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := bus.PublishInput(cctx, js, "ctx.nowhere.c1.turn", id, nil); err == nil {
		t.Fatal("a subject outside ctx.in was published")
	}
}
