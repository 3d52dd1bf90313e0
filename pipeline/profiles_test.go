package pipeline_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/internal/natstest"
	"github.com/ctxpipe/ctxpipe/pipeline"
	"github.com/ctxpipe/ctxpipe/schema"
)

func TestProfilesSeedAndWatch(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, url := natstest.Run(t)
	js, err := jetstream.New(natstest.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := bus.EnsureProfiles(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	a := schema.Profile{ID: "a", ContextWindow: 1000}
	if err := pipeline.SeedProfiles(ctx, kv, []schema.Profile{a}); err != nil {
		t.Fatal(err)
	}
	ps, err := pipeline.WatchProfiles(ctx, kv, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := ps.Get("a"); !ok || p.ContextWindow != 1000 {
		t.Fatalf("seeded profile: %+v %v", p, ok)
	}
	// A change in the bucket applies without a restart.
	b, _ := schema.Marshal(schema.Profile{ID: "a", ContextWindow: 2000})
	if _, err := kv.Put(ctx, "a", b); err != nil {
		t.Fatal(err)
	}
	// An invalid document is ignored: the previous version stays.
	if _, err := kv.Put(ctx, "a", []byte(`{"id":"a","context_window":-5}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "b", []byte(`{"id":"b","context_window":500}`)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		pa, _ := ps.Get("a")
		_, okb := ps.Get("b")
		if pa.ContextWindow == 2000 && okb {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("watch did not apply the update: a=%+v b=%v", pa, okb)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Seeding again never overwrites what the bucket has.
	if err := pipeline.SeedProfiles(ctx, kv, []schema.Profile{a}); err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := schema.DecodeProfile(e.Value()); p.ContextWindow == 1000 {
		t.Fatal("seeding overwrote a changed profile")
	}
	// A deleted profile goes away.
	if err := kv.Delete(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	for deadline = time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, ok := ps.Get("b"); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("delete not applied")
		}
	}
}
