package changelog

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/internal/natstest"
)

// The follower's watchdog stops the iterator when the follower has waited
// too long for a message while the stream holds one past the last it got
// (an ordered consumer re-creating itself quietly after a node loss), and
// only then: not while the follower is busy elsewhere, nor when the stream
// has nothing more.
func TestWatchStopsAStalledFollower(t *testing.T) {
	_, url := natstest.Run(t)
	js, err := jetstream.New(natstest.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := bus.EnsureStreams(ctx, js); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := js.Publish(ctx, bus.StateSubject(1), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	stream, err := js.Stream(ctx, bus.StreamState)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		last    uint64
		waiting bool
		stalled bool
	}{
		{"waiting with messages after the last", 1, true, true},
		{"waiting at the stream's end", 3, true, false},
		{"busy (not waiting) with messages after the last", 1, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &watch{after: 200 * time.Millisecond, last: tc.last}
			if tc.waiting {
				w.wait()
			}
			stopped := make(chan struct{})
			wctx, cancel := context.WithCancel(ctx)
			defer cancel()
			go w.run(wctx, stream, func() { close(stopped) })
			select {
			case <-stopped:
				if !tc.stalled || w.Err() == nil {
					t.Fatalf("stopped (err %v); want stalled %v", w.Err(), tc.stalled)
				}
			case <-time.After(1500 * time.Millisecond):
				if tc.stalled {
					t.Fatal("a stalled follower was not stopped")
				}
			}
		})
	}
}
