package natstest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestClusterSurvivesLeaderLoss checks what a failover test relies on: an R3
// stream and its consumer get leaders, the leader's node can be shut down by
// name, publishing and consuming go on through the other two nodes, and the
// node rejoins with its store when restarted.
func TestClusterSurvivesLeaderLoss(t *testing.T) {
	start := time.Now()
	c := RunCluster(t)
	t.Logf("3-node cluster up in %v", time.Since(start).Round(time.Millisecond))
	if got := len(c.URLs()); got != ClusterSize {
		t.Fatalf("URLs() has %d entries, want %d", got, ClusterSize)
	}
	nc := Connect(t, c.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Five seconds per request: one lost in an election is sent again
	// rather than waited for until the test's end.
	reqCtx := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 5*time.Second) }
	rctx, rcancel := reqCtx()
	_, err = js.CreateStream(rctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Replicas: 3})
	rcancel()
	if err != nil {
		t.Fatalf("create R3 stream: %v", err)
	}
	// The same for the consumer: right after the stream's creation its
	// placement may still be settling, and a request lost meanwhile would
	// hold the test for the whole two minutes (seen once in CI).
	var cons jetstream.Consumer
	for {
		rctx, rcancel := reqCtx()
		cons, err = js.CreateOrUpdateConsumer(rctx, "S", jetstream.ConsumerConfig{Durable: "d", AckPolicy: jetstream.AckExplicitPolicy})
		rcancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("create consumer: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Replicas != 0 && info.Config.Replicas != 3 {
		t.Fatalf("consumer replicas = %d, want the stream's 3", info.Config.Replicas)
	}

	publishAndRead := func(step string, n int) {
		t.Helper()
		// Publishes retry: right after a leader loss the stream may have
		// no leader for a few seconds.
		for {
			rctx, rcancel := reqCtx()
			_, err := js.Publish(rctx, "s.x", []byte(step))
			rcancel()
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("%s: publish: %v", step, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		for {
			batch, err := cons.Fetch(1, jetstream.FetchMaxWait(time.Second))
			if err == nil {
				for m := range batch.Messages() {
					if string(m.Data()) != step {
						t.Fatalf("%s: read %q", step, m.Data())
					}
					if err := m.DoubleAck(ctx); err != nil {
						t.Fatalf("%s: ack: %v", step, err)
					}
					n--
				}
				if n == 0 {
					return
				}
			}
			if ctx.Err() != nil {
				t.Fatalf("%s: fetch: %v", step, err)
			}
		}
	}
	publishAndRead("before", 1)

	steps := []struct {
		name   string
		leader func() string
		stop   func(name string) int
	}{
		{"consumer leader shut down", func() string { return c.WaitConsumerLeader("S", "d") }, c.ShutdownByName},
		{"consumer leader killed", func() string { return c.WaitConsumerLeader("S", "d") }, c.KillByName},
		{"stream leader killed", func() string { return c.WaitStreamLeader("S") }, c.KillByName},
	}
	for _, st := range steps {
		name := st.leader()
		down := time.Now()
		i := st.stop(name)
		if c.Server(i) != nil || c.Name(i) != name {
			t.Fatalf("%s: node %d (%s) still listed as up", st.name, i, name)
		}
		if got := st.leader(); got == name || got == "" {
			t.Fatalf("%s: leader is %q after %s went down", st.name, got, name)
		}
		elected := time.Since(down)
		publishAndRead(st.name, 1)
		t.Logf("%s (%s): new leader after %v, a message through after %v", st.name, name,
			elected.Round(time.Millisecond), time.Since(down).Round(time.Millisecond))
		restart := time.Now()
		c.Restart(i)
		t.Logf("%s rejoined in %v", name, time.Since(restart).Round(time.Millisecond))
		if c.Server(i) == nil {
			t.Fatalf("%s: node %d not up after Restart", st.name, i)
		}
	}
	// The restarted nodes still hold the stream: its replicas are all
	// current again.
	deadline := time.Now().Add(time.Minute)
	for {
		s, err := js.Stream(ctx, "S")
		if err == nil {
			ci := s.CachedInfo().Cluster
			ok := ci != nil && ci.Leader != "" && len(ci.Replicas) == 2
			for _, r := range ci.Replicas {
				ok = ok && r.Current && !r.Offline
			}
			if ok {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("stream replicas not current after the restarts: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
