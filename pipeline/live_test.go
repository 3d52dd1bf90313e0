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

// The live list: refreshed within liveWithin and not catching up.
func TestLiveFromTheWatch(t *testing.T) {
	now := time.Unix(1000, 0)
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	tests := []struct {
		name string
		seen map[string]lockSeen
		want []string
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
	}
	for _, tt := range tests {
		if got := liveAt(tt.seen, now); !slices.Equal(got, tt.want) {
			t.Errorf("%s: liveAt = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// The watch is believed only while it delivers: every live instance, this
// one included, refreshes its lock every second through it.
func TestWatchCurrent(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, tt := range []struct {
		name  string
		last  time.Time
		stale string // the error contains it; "" for none
	}{
		{"delivered a moment ago", now.Add(-time.Second), ""},
		{"exactly liveWithin ago", now.Add(-liveWithin), ""},
		{"silent past liveWithin: everyone would look dead", now.Add(-5 * time.Second), "delivered nothing for 5s"},
		{"nothing yet", time.Time{}, "nothing yet"},
	} {
		err := watchCurrent(tt.last, now)
		switch {
		case tt.stale == "" && err != nil:
			t.Errorf("%s: %v, want current", tt.name, err)
		case tt.stale != "" && (err == nil || !strings.Contains(err.Error(), tt.stale)):
			t.Errorf("%s: %v, want an error with %q", tt.name, err, tt.stale)
		}
	}
}

func TestWatchStale(t *testing.T) {
	start := time.Date(2026, 11, 29, 3, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		name      string
		last, now time.Time
		stale     string // "" when the watch is current
	}{
		{"just started, nothing yet", time.Time{}, start.Add(time.Second), ""},
		{"nothing since it started, past the bound", time.Time{}, start.Add(restartStale + time.Millisecond), "since it started"},
		{"a delivery before this watch started counts for nothing", start.Add(-time.Second), start.Add(restartStale + time.Millisecond), "since it started"},
		{"delivered a refresh ago", start.Add(5 * time.Second), start.Add(5*time.Second + refreshEvery), ""},
		{"silent exactly the bound", start.Add(5 * time.Second), start.Add(5*time.Second + restartStale), ""},
		{"silent past the bound", start.Add(5 * time.Second), start.Add(5*time.Second + restartStale + time.Millisecond), "delivered nothing for"},
		{"silent 8 s, as a watch on a lost node was", start.Add(5 * time.Second), start.Add(13 * time.Second), "delivered nothing for 8s"},
	} {
		err := watchStale(start, tt.last, tt.now)
		switch {
		case tt.stale == "" && err != nil:
			t.Errorf("%s: %v, want current", tt.name, err)
		case tt.stale != "" && (err == nil || !strings.Contains(err.Error(), tt.stale)):
			t.Errorf("%s: %v, want an error with %q", tt.name, err, tt.stale)
		}
	}
}

// A watch that delivers nothing (it stopped delivering, or no instance
// refreshes) ends, so that run starts it again, rather than leaving Live
// failing for good; one that delivers the refreshes goes on.
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
	go func() { ended <- w.watchOnce(ctx, kv) }()
	select {
	case err := <-ended:
		t.Fatalf("a watch showing the refreshes ended: %v", err)
	case <-time.After(restartStale + 2*liveWithin):
	}
	if live, err := w.live(ctx); err != nil || !slices.Equal(live, []string{"self"}) {
		t.Fatalf("live %v, %v", live, err)
	}
	// No more refreshes: Live fails, and the watch ends soon after.
	stopRefreshing()
	select {
	case err := <-ended:
		if err == nil || !strings.Contains(err.Error(), "delivered nothing") {
			t.Fatalf("the stale watch ended with %v", err)
		}
	case <-time.After(restartStale + liveWithin):
		t.Fatal("a watch showing no refresh of this instance's lock went on")
	}
	if _, err := w.live(ctx); err == nil {
		t.Fatal("Live believed a watch that delivers nothing")
	}
}
