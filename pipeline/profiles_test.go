package pipeline_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
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

// After a broker restart the profile watch is started again at once: a
// profile put after the restart is seen within 5 s, well under the 13-15 s
// a watch takes to notice by itself that its consumer is gone. The bound is
// that difference, not a speed goal.
func TestProfilesRewatchAfterBrokerRestart(t *testing.T) {
	dir, port := t.TempDir(), natstest.FreePort(t)
	startServer := func() *server.Server {
		s, err := server.NewServer(&server.Options{ServerName: "restart", Host: "127.0.0.1", Port: port,
			JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
		if err != nil {
			t.Fatal(err)
		}
		go s.Start()
		if !s.ReadyForConnections(10 * time.Second) {
			t.Fatal("server not ready")
		}
		return s
	}
	s := startServer()
	nc := natstest.Connect(t, s.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kv, err := bus.EnsureProfiles(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := pipeline.WatchProfiles(ctx, kv, slog.New(slog.DiscardHandler), nc.StatusChanged(nats.CONNECTED))
	if err != nil {
		t.Fatal(err)
	}
	s.Shutdown()
	s.WaitForShutdown()
	s = startServer()
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	b, _ := schema.Marshal(schema.Profile{ID: "after", ContextWindow: 1234})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := kv.Put(ctx, "after", b); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("put after the restart: %v", err)
		}
	}
	put := time.Now()
	for {
		if p, ok := ps.Get("after"); ok && p.ContextWindow == 1234 {
			t.Logf("seen %v after the put", time.Since(put).Round(time.Millisecond))
			return
		}
		if time.Since(put) > 5*time.Second {
			t.Fatal("a profile put after the broker restart was not seen by the watch")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
