package pipeline

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/internal/natstest"
)

// The live list: refreshed within liveWithin and not catching up; the
// watch is trusted only while it shows this instance's own refreshes.
func TestLiveFromTheWatch(t *testing.T) {
	now := time.Unix(1000, 0)
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	tests := []struct {
		name  string
		seen  map[string]lockSeen
		want  []string
		stale string // watchCurrent's error contains it; "" for none
	}{
		{
			name: "fresh ones, sorted",
			seen: map[string]lockSeen{"b": {at: ago(time.Second)}, "a": {at: ago(0)}, "self": {at: ago(500 * time.Millisecond)}},
			want: []string{"a", "b", "self"},
		},
		{
			name: "a silent one drops out at once, long before its lock lapses",
			seen: map[string]lockSeen{"dead": {at: ago(liveWithin + time.Millisecond)}, "self": {at: ago(0)}},
			want: []string{"self"},
		},
		{
			name: "exactly liveWithin is still live",
			seen: map[string]lockSeen{"edge": {at: ago(liveWithin)}, "self": {at: ago(0)}},
			want: []string{"edge", "self"},
		},
		{
			name: "catching up: holds its name, owns nothing",
			seen: map[string]lockSeen{"late": {at: ago(0), catchingUp: true}, "self": {at: ago(0)}},
			want: []string{"self"},
		},
		{
			name:  "this instance catching up itself: the watch is current all the same",
			seen:  map[string]lockSeen{"other": {at: ago(0)}, "self": {at: ago(0), catchingUp: true}},
			want:  []string{"other"},
			stale: "",
		},
		{
			name:  "the watch stopped delivering: everyone looks dead, so it is not believed",
			seen:  map[string]lockSeen{"other": {at: ago(5 * time.Second)}, "self": {at: ago(5 * time.Second)}},
			want:  nil,
			stale: "refreshed 5s ago",
		},
		{
			name:  "this instance's lock not seen yet",
			seen:  map[string]lockSeen{"other": {at: ago(0)}},
			want:  []string{"other"},
			stale: "has not shown",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := liveAt(tt.seen, now); !slices.Equal(got, tt.want) {
				t.Errorf("liveAt = %v, want %v", got, tt.want)
			}
			err := watchCurrent(tt.seen, "self", now)
			switch {
			case tt.stale == "" && err != nil:
				t.Errorf("watchCurrent: %v, want current", err)
			case tt.stale != "" && (err == nil || !strings.Contains(err.Error(), tt.stale)):
				t.Errorf("watchCurrent: %v, want an error with %q", err, tt.stale)
			}
		})
	}
}

// A watch that shows no refresh of this instance's own lock (it stopped
// delivering, or this instance stopped refreshing) ends, so that run starts
// it again, rather than leaving Live failing for good; one that shows the
// refreshes goes on.
func TestStaleWatchIsStartedAgain(t *testing.T) {
	_, url := natstest.Run(t)
	js, err := jetstream.New(natstest.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: LocksBucket, History: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "instance.self", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	// Refreshed: the watch goes on past restartStale.
	refreshing, stopRefreshing := context.WithCancel(ctx)
	go func() {
		for refreshing.Err() == nil {
			_, _ = kv.Put(ctx, "instance.self", []byte(`{}`))
			time.Sleep(refreshEvery)
		}
	}()
	w := newLiveWatch()
	ended := make(chan error, 1)
	go func() { ended <- w.watchOnce(ctx, kv, "self") }()
	select {
	case err := <-ended:
		t.Fatalf("a watch showing the refreshes ended: %v", err)
	case <-time.After(restartStale + 2*liveWithin):
	}
	if live, err := w.live(ctx, "self"); err != nil || !slices.Equal(live, []string{"self"}) {
		t.Fatalf("live %v, %v", live, err)
	}
	// No more refreshes: Live fails at once, and the watch ends soon after.
	stopRefreshing()
	select {
	case err := <-ended:
		if err == nil || !strings.Contains(err.Error(), "has not shown") {
			t.Fatalf("the stale watch ended with %v", err)
		}
	case <-time.After(restartStale + 2*liveWithin):
		t.Fatal("a watch showing no refresh of this instance's lock went on")
	}
	if _, err := w.live(ctx, "self"); err == nil {
		t.Fatal("Live believed a watch that shows this instance's lock stale")
	}
}
