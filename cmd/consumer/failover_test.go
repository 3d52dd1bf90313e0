package main

import (
	"context"
	"math/rand/v2"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/internal/natstest"
	"github.com/ctxpipe/ctxpipe/schema"
)

// TestNodeLossKeepsConsuming runs the real service against a 3-node
// cluster with its streams and buckets at R3 and takes nodes away from
// under it: the node leading the durable consumer, then the node leading
// CTX_IN, then two nodes at once (no quorum). After each loss, turns keep
// becoming readable with no restart; without quorum /readyz says unready,
// and ready again once the nodes are back. Every turn is stored once, in
// order. Before the runner rebuilt its consumer, the first loss stopped
// consumption for good while /healthz said ok.
func TestNodeLossKeepsConsuming(t *testing.T) {
	c := natstest.RunCluster(t)
	for _, k := range llmEnv {
		t.Setenv(k, "")
	}
	m := &testMain{Main: NewMain()}
	m.Config.DataDir = t.TempDir()
	m.Config.NATS.URL = c.URL()
	m.Config.Replicas = 3
	// Few partitions: each is a replicated consumer the cluster must place.
	m.Config.Partitions = 8
	m.Config.HTTP = "127.0.0.1:0"
	m.Log = testLogger(t)
	if err := m.Run(context.Background()); err != nil {
		_ = m.Close()
		t.Fatalf("run: %v", err)
	}
	t.Cleanup(func() { _ = m.Close() })
	readyz := "http://" + m.HTTPAddr() + "/readyz"

	agent := connect(t, c.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	rng := rand.New(rand.NewPCG(14, 14))
	const conv = "node-loss"
	ts := time.Now().UnixMilli()
	var sent []schema.Turn
	// send publishes the next turn, retrying while the cluster elects a
	// stream leader (the same id each time: JetStream drops copies), and
	// returns how long until the service had applied it.
	send := func() time.Duration {
		t.Helper()
		tn := textTurn(rng, conv, "demo-16k", len(sent), ts+int64(len(sent)), 40)
		sent = append(sent, tn)
		data, err := schema.Marshal(tn)
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := bus.PublishInput(ctx, agent.js, schema.InputSubject(conv, schema.KindTurn), tn.ID, data)
			cancel()
			if err == nil {
				break
			}
			if time.Since(t0) > time.Minute {
				t.Fatalf("publish turn %d: %v", len(sent)-1, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		for {
			_, err := agent.history(conv, schema.ViewFull, tn.ID, 5*time.Second)
			if err == nil {
				return time.Since(t0)
			}
			if time.Since(t0) > time.Minute {
				t.Fatalf("turn %d never became readable: %v", len(sent)-1, err)
			}
		}
	}
	waitReady := func(want int, what string) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			code, body := httpGet(t, readyz)
			if code == want {
				t.Logf("/readyz %d %s: %s", code, what, body)
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("/readyz stayed %d (%s), want %d %s", code, body, want, what)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	for range 5 {
		send()
	}
	waitReady(http.StatusOK, "before any loss")

	// Nodes are killed, not shut down: no leader hands over, and the
	// cluster learns of the loss only when its own timeouts fire, as after
	// a SIGKILL.
	lose := func(name, what string) {
		t.Helper()
		killed := time.Now()
		i := c.KillByName(name)
		t.Logf("killed %s (%s)", name, what)
		send()
		t.Logf("first turn published after the kill readable %v after the kill", time.Since(killed).Round(time.Millisecond))
		for range 2 {
			send()
		}
		c.Restart(i)
		c.WaitStreamLeader(bus.StreamIn)
	}
	// The conversation has no tenant: the shared partition, numbered N.
	lose(c.WaitConsumerLeader(bus.StreamIn, bus.ConsumerFor("ctxpipe", 8)), "leader of the conversation's partition consumer")
	lose(c.WaitStreamLeader(bus.StreamIn), "leader of CTX_IN")
	waitReady(http.StatusOK, "after single-node losses")

	// Two nodes down: no quorum, nothing can be consumed, and /readyz
	// must say so; /healthz (the process is alive) stays ok.
	keep := c.WaitStreamLeader(bus.StreamIn)
	var down []int
	for i := range 3 {
		if c.Name(i) != keep {
			c.Kill(i)
			down = append(down, i)
		}
	}
	waitReady(http.StatusServiceUnavailable, "without quorum")
	if code, body := httpGet(t, "http://"+m.HTTPAddr()+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz %d %s without quorum: the process is alive", code, body)
	}
	for _, i := range down {
		c.Restart(i)
	}
	waitReady(http.StatusOK, "once quorum is back")
	send()

	full, err := agent.history(conv, schema.ViewFull, "", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, msg := range full {
		if msg.IsSummary || msg.IsTruncationMarker {
			continue
		}
		got = append(got, msg.ID)
	}
	if want := idsOf(sent); !slices.Equal(got, want) {
		t.Fatalf("stored turns %v\nwant each sent turn once, in order: %v", got, want)
	}
	select {
	case err := <-m.Failed():
		t.Fatalf("the service failed: %v", err)
	default:
	}
}
