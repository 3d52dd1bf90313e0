package pipeline_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/internal/natstest"
	"github.com/ctxpipe/ctxpipe/pipeline"
	"github.com/ctxpipe/ctxpipe/schema"
)

// An owner that died holding an input of a partition that then stays quiet
// used to delay that input by the whole ack wait: the next owner gets the
// pin only with a delivery, and the only delivery left was the input's own
// redelivery. Here the ack wait is a minute; the input must be applied
// within seconds, with no other input arriving.
func TestSilentOwnersInputIsTakenWithoutANewInput(t *testing.T) {
	ctx := context.Background()
	_, url := natstest.Run(t)
	js, err := jetstream.New(natstest.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	if err := bus.EnsureStreams(ctx, js); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, bus.StreamIn)
	if err != nil {
		t.Fatal(err)
	}
	n := bus.PartitionsOf(s.CachedInfo().Config)
	cfg := pipeline.Config{Lanes: 4, AckWait: time.Minute, MaxDeliver: 5, RetryBudget: time.Second}

	// The owner before: it pulls the shared partition's consumer (a
	// conversation without a tenant) under the priority group, receives
	// the turn under a pin, and dies without acking it.
	turn := schema.Turn{ID: uuid.NewString(), ConversationID: "quiet", TS: 1_700_000_000_000,
		Role: schema.RoleUser, Content: schema.TextContent("held by an owner that died")}
	data, err := json.Marshal(turn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, schema.InputSubject(turn.ConversationID, schema.KindTurn), data, jetstream.WithMsgID(turn.ID)); err != nil {
		t.Fatal(err)
	}
	dead := natstest.Connect(t, url)
	djs, err := jetstream.New(dead)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := djs.CreateOrUpdateConsumer(ctx, bus.StreamIn, jetstream.ConsumerConfig{
		Durable: bus.ConsumerFor("ctxpipe", n), AckPolicy: jetstream.AckExplicitPolicy, AckWait: cfg.AckWait,
		MaxDeliver: -1, MaxAckPending: 1024, FilterSubject: bus.PartitionFilter(n, n),
		DeliverPolicy: jetstream.DeliverAllPolicy, PriorityGroups: []string{pipeline.PriorityGroup},
		PriorityPolicy: jetstream.PriorityPolicyPinned, PinnedTTL: 3 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchPriorityGroup(pipeline.PriorityGroup), jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	msg, ok := <-batch.Messages()
	if !ok || msg.Headers().Get("Nats-Pin-Id") == "" {
		t.Fatalf("the first owner did not receive the turn under a pin: %v %v", ok, batch.Error())
	}
	dead.Close()

	// The next owner starts; nothing else is published.
	h := startOn(t, url, cfg, nil)
	start := time.Now()
	for {
		ms, err := h.store.Messages(ctx, turn.ConversationID)
		if err != nil {
			t.Fatal(err)
		}
		if len(ms) == 1 && ms[0].ID == turn.ID {
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("the held turn is not applied %v after the new owner started (ack wait %v)", time.Since(start), cfg.AckWait)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("applied %v after the new owner started", time.Since(start).Round(time.Millisecond))
	if got := h.metrics.Value("ctxpipe_partitions_adopted_total", ""); got < 1 {
		t.Fatalf("adopted %v partitions: the turn came some other way", got)
	}
}
