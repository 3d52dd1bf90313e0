package bus

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/internal/natstest"
)

func TestTransient(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"JetStream not ready", fmt.Errorf("ensure: %w", jetstream.ErrJetStreamNotEnabled), true},
		{"cluster unavailable", &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}, true},
		{"a peer offline at placement", &jetstream.APIError{Code: 400, ErrorCode: 10005, Description: "no suitable peers for placement, peer offline"}, true},
		{"too few peers at all", &jetstream.APIError{Code: 400, ErrorCode: 10005, Description: "no suitable peers for placement"}, false},
		{"request timed out", fmt.Errorf("x: %w", context.DeadlineExceeded), true},
		{"no responders", nats.ErrNoResponders, true},
		{"reconnecting", nats.ErrConnectionReconnecting, true},
		{"bad configuration", &jetstream.APIError{Code: 400, ErrorCode: 10052, Description: "replicas > 1 not supported in non-clustered mode"}, false},
		{"stream not found", jetstream.ErrStreamNotFound, false},
		{"closed", nats.ErrConnectionClosed, false},
		{"other", errors.New("boom"), false},
	}
	for _, tt := range tests {
		if got := Transient(tt.err); got != tt.want {
			t.Errorf("%s: Transient(%v) = %v, want %v", tt.name, tt.err, got, tt.want)
		}
	}
}

// TestRetryStartWaitsForQuorum: the broker answers but its JetStream cannot
// (two of three nodes down, no meta leader). The start waits, says so, and
// completes once the nodes are back, instead of failing.
func TestRetryStartWaitsForQuorum(t *testing.T) {
	c := natstest.RunCluster(t)
	nc := natstest.Connect(t, c.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	defer func(d time.Duration) { attemptTimeout = d }(attemptTimeout)
	attemptTimeout = 2 * time.Second
	// Keep the node the client is on, if it is one of n1..n3.
	keep := c.Index(nc.ConnectedServerName())
	if keep < 0 {
		t.Fatalf("connected to %q", nc.ConnectedServerName())
	}
	var down []int
	for i := range natstest.ClusterSize {
		if i != keep {
			c.Kill(i)
			down = append(down, i)
		}
	}
	logs, log := newLogBuffer()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- RetryStart(ctx, log, "ensure streams", func(ctx context.Context) error {
			return EnsureStreams(ctx, js, WithReplicas(3), WithLogger(log))
		})
	}()
	waitLog(t, logs, "level=WARN", `msg="ensure streams failed, retrying in `, "attempt=2")
	for _, i := range down {
		c.Restart(i)
	}
	if err := <-done; err != nil {
		t.Fatalf("RetryStart: %v", err)
	}
	waitLog(t, logs, "level=INFO", `msg="ensure streams succeeded"`, "attempts=", "waited=")
	s, err := js.Stream(ctx, StreamIn)
	if err != nil {
		t.Fatal(err)
	}
	if r := s.CachedInfo().Config.Replicas; r != 3 {
		t.Fatalf("replicas = %d, want 3", r)
	}

	// A refusal is not retried, and a done context ends the wait.
	err = RetryStart(ctx, log, "refused", func(context.Context) error { return jetstream.ErrStreamNotFound })
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("err = %v, want the refusal itself", err)
	}
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	err = RetryStart(short, log, "never", func(context.Context) error { return nats.ErrNoResponders })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the context's", err)
	}
}
