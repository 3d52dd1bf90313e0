package pipeline_test

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/internal/natstest"
	"github.com/ctxpipe/ctxpipe/pipeline"
)

// An instance still catching up with the changelog holds its name but is
// not among the live ones (it owns no partition) until it says it caught up.
func TestLiveLeavesOutInstancesCatchingUp(t *testing.T) {
	_, url := natstest.Run(t)
	js, err := jetstream.New(natstest.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	ready, err := pipeline.AcquireLock(ctx, js, "ready", pipeline.Holder{Host: "h", DataDir: "/a"}, 1, log)
	if err != nil {
		t.Fatal(err)
	}
	late, err := pipeline.AcquireLock(ctx, js, "late", pipeline.Holder{Host: "h", DataDir: "/b", CatchingUp: true}, 1, log)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = ready.Hold(ctx) }()
	go func() { _ = late.Hold(ctx) }()
	live, err := ready.Live(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(live, []string{"ready"}) {
		t.Fatalf("live %v, want only the instance not catching up", live)
	}
	late.CaughtUp()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if live, err = ready.Live(ctx); err == nil && len(live) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("live %v (%v) after the late instance caught up", live, err)
		}
	}
}
