package changelog

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/internal/natstest"
)

// stateStreamHolding is a CTX_STATE holding n messages of partition 1.
func stateStreamHolding(t *testing.T, n int) jetstream.Stream {
	t.Helper()
	js, stream := stateStream(t)
	for range n {
		if _, err := js.Publish(context.Background(), bus.StateSubject(1), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	return stream
}

// startWatch runs w's watchdog on stream until the test ends; the channel
// is closed when it stops the follower.
func startWatch(t *testing.T, w *watch, stream jetstream.Stream) <-chan struct{} {
	stopped := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go w.run(ctx, stream, func() { close(stopped) })
	return stopped
}

// The follower's watchdog stops the iterator when the follower has waited
// too long for a message while the stream holds one past the last it got
// (an ordered consumer re-creating itself quietly after a node loss), and
// only then: not while the follower is busy elsewhere, nor when the stream
// has nothing more. A stream whose end the server cannot tell (its info
// requests fail while its leader is elected after a node loss, which is
// when an ordered consumer dies without a word) counts as one holding more,
// and the error says the end was unknown.
func TestWatchStopsAStalledFollower(t *testing.T) {
	stream := stateStreamHolding(t, 3)
	for _, tc := range []struct {
		name       string
		last       uint64
		waiting    bool
		unreadable bool // the stream's info requests fail
		stalled    bool
	}{
		{"waiting with messages after the last", 1, true, false, true},
		{"waiting at the stream's end", 3, true, false, false},
		{"busy (not waiting) with messages after the last", 1, false, false, false},
		{"waiting, the stream unreadable", 1, true, true, true},
		{"waiting at what was the stream's end, the stream unreadable", 3, true, true, true},
		{"busy (not waiting), the stream unreadable", 1, false, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &watch{after: 200 * time.Millisecond, last: tc.last}
			if tc.waiting {
				w.wait()
			}
			var s jetstream.Stream = stream
			if tc.unreadable {
				s = failingInfo{Stream: stream}
			}
			stopped := startWatch(t, w, s)
			select {
			case <-stopped:
				if !tc.stalled || w.Err() == nil {
					t.Fatalf("stopped (err %v); want stalled %v", w.Err(), tc.stalled)
				}
				if unknown := strings.Contains(w.Err().Error(), "cannot tell"); unknown != tc.unreadable {
					t.Fatalf("err %q: want it to say the end was unknown: %v", w.Err(), tc.unreadable)
				}
			case <-time.After(1500 * time.Millisecond):
				if tc.stalled {
					t.Fatal("a stalled follower was not stopped")
				}
			}
		})
	}
}

// A run that has received nothing while the stream holds messages past its
// start (its ordered consumer's creation unanswered, after a node loss) is
// stopped sooner than one that stopped receiving: after the half delay and
// a quarter, before the two whole delays.
func TestWatchStopsARunThatReceivedNothingSooner(t *testing.T) {
	stream := stateStreamHolding(t, 3)
	const after = 800 * time.Millisecond
	for _, tc := range []struct {
		name     string
		received bool
		within   time.Duration // stopped by then
		notYet   time.Duration // and not before
	}{
		// Before the two whole delays a run that received is given.
		{"received nothing", false, 2 * after, after/2 + after/4},
		{"received before", true, 2*after + time.Second, 2 * after},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &watch{after: after, last: 1}
			if tc.received {
				w.got(1)
			}
			w.wait()
			began := time.Now()
			stopped := startWatch(t, w, stream)
			select {
			case <-stopped:
				if took := time.Since(began); took < tc.notYet || w.Err() == nil {
					t.Fatalf("stopped after %v (err %v), not before %v", took, w.Err(), tc.notYet)
				}
			case <-time.After(tc.within):
				t.Fatalf("not stopped within %v", tc.within)
			}
		})
	}
}

// A follower that waited long at the stream's end is not stalled the
// moment a message is appended: it is stalled only when the stream has held
// the message past its last for the watchdog's whole delay, however long
// it idled before (16 s idle and then a 3 MiB append must not trip it).
func TestWatchCountsFromTheAppendNotTheIdleWait(t *testing.T) {
	ctx := context.Background()
	js, stream := stateStream(t)
	ack, err := js.Publish(ctx, bus.StateSubject(1), []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	const after = 400 * time.Millisecond
	w := &watch{after: after, last: ack.Sequence}
	w.wait()
	w.mu.Lock()
	w.waiting = time.Now().Add(-20 * after) // a long idle wait at the end
	w.mu.Unlock()
	stopped := make(chan struct{})
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go w.run(wctx, stream, func() { close(stopped) })
	time.Sleep(after / 2) // the watchdog ticks at the end: idle
	next, err := js.Publish(ctx, bus.StateSubject(1), []byte("y"))
	if err != nil {
		t.Fatal(err)
	}
	// Delivered a little later than a tick, well within the delay.
	time.Sleep(after / 2)
	w.got(next.Sequence)
	w.wait()
	select {
	case <-stopped:
		t.Fatalf("stopped a follower that got the new message in time: %v", w.Err())
	case <-time.After(3 * after):
	}
	// Not delivered at all: stopped, the delay after it was seen behind.
	if _, err := js.Publish(ctx, bus.StateSubject(1), []byte("z")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-stopped:
		if w.Err() == nil {
			t.Fatal("stopped without saying why")
		}
	case <-time.After(4 * after):
		t.Fatal("a follower that never got the message was not stopped")
	}
}

// A follower of some partitions, idle while the stream's last message is
// another partition's, is not stalled; and the watchdog asks for its
// subjects' last messages once per end of the stream, not at every tick
// (an idle instance holding 32 partitions made 33 requests a second). Once
// one of its subjects holds a message past its last, it is stalled.
func TestWatchAsksForItsSubjectsOncePerStreamEnd(t *testing.T) {
	ctx := context.Background()
	js, stream := stateStream(t)
	ack, err := js.Publish(ctx, bus.StateSubject(1), []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, bus.StateSubject(2), []byte("other")); err != nil {
		t.Fatal(err)
	}
	counted := &lookups{Stream: stream}
	const after = 200 * time.Millisecond // a tick every 50 ms
	w := &watch{after: after, last: ack.Sequence, subjects: []string{bus.StateSubject(1)}}
	w.wait()
	w.mu.Lock()
	w.waiting = time.Now().Add(-10 * after)
	w.mu.Unlock()
	stopped := make(chan struct{})
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go w.run(wctx, counted, func() { close(stopped) })
	time.Sleep(8 * after)
	if n := counted.n.Load(); n != 1 {
		t.Fatalf("%d lookups of the subjects' last message over %d ticks at one stream end, want 1", n, 8*4)
	}
	// Another partition's message moves the end: asked once more, still
	// not stalled.
	if _, err := js.Publish(ctx, bus.StateSubject(2), []byte("other")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(8 * after)
	select {
	case <-stopped:
		t.Fatalf("stopped a follower whose partitions hold nothing new: %v", w.Err())
	default:
	}
	if n := counted.n.Load(); n != 2 {
		t.Fatalf("%d lookups after the end moved once, want 2", n)
	}
	// Its own partition's message never delivered: stalled.
	if _, err := js.Publish(ctx, bus.StateSubject(1), []byte("y")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-stopped:
		if w.Err() == nil {
			t.Fatal("stopped without saying why")
		}
	case <-time.After(8 * after):
		t.Fatal("a follower that never got its partition's message was not stopped")
	}
}

// A follower of some partitions whose subjects' last messages the server
// cannot tell (the requests time out while a node is lost) is stopped when
// the stream holds messages past its last: "cannot tell" is not "idle".
func TestWatchStopsAFollowerWhenItsSubjectsCannotBeRead(t *testing.T) {
	ctx := context.Background()
	js, stream := stateStream(t)
	ack, err := js.Publish(ctx, bus.StateSubject(1), []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, bus.StateSubject(1), []byte("y")); err != nil {
		t.Fatal(err)
	}
	const after = 200 * time.Millisecond
	w := &watch{after: after, last: ack.Sequence, subjects: []string{bus.StateSubject(1)}}
	w.wait()
	stopped := make(chan struct{})
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go w.run(wctx, &failingLookups{Stream: stream}, func() { close(stopped) })
	select {
	case <-stopped:
		if w.Err() == nil {
			t.Fatal("stopped without saying why")
		}
	case <-time.After(10 * after):
		t.Fatal("a follower behind the stream was not stopped while its subjects could not be read")
	}
}

// failingInfo fails every stream info request, as a stream without a
// leader.
type failingInfo struct{ jetstream.Stream }

func (failingInfo) Info(context.Context, ...jetstream.StreamInfoOpt) (*jetstream.StreamInfo, error) {
	return nil, context.DeadlineExceeded
}

// failingLookups fails every last-message-of-subject request, as a server
// that cannot answer in time.
type failingLookups struct{ jetstream.Stream }

func (failingLookups) GetLastMsgForSubject(context.Context, string) (*jetstream.RawStreamMsg, error) {
	return nil, context.DeadlineExceeded
}

// lookups counts a stream's last-message-of-subject requests.
type lookups struct {
	jetstream.Stream
	n atomic.Int64
}

func (l *lookups) GetLastMsgForSubject(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error) {
	l.n.Add(1)
	return l.Stream.GetLastMsgForSubject(ctx, subject)
}

// stateStream starts a server with ctxpipe's streams and returns CTX_STATE.
func stateStream(t *testing.T) (jetstream.JetStream, jetstream.Stream) {
	t.Helper()
	_, url := natstest.Run(t)
	js, err := jetstream.New(natstest.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	if err := bus.EnsureStreams(context.Background(), js); err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(context.Background(), bus.StreamState)
	if err != nil {
		t.Fatal(err)
	}
	return js, stream
}
