package client_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/ctxpipe/ctxpipe/client"
	"github.com/ctxpipe/ctxpipe/client/clienttest"
	"github.com/ctxpipe/ctxpipe/internal/natstest"
	"github.com/ctxpipe/ctxpipe/schema"
)

// reconnecting is a client whose connection comes back at once after the
// server does.
func reconnecting(t *testing.T, svc *clienttest.Service) (*client.Client, *nats.Conn) {
	t.Helper()
	nc := natstest.Connect(t, svc.URL, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	c, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return c, nc
}

// waitConnected returns once each connection is up again (its
// subscriptions at the server).
func waitConnected(t *testing.T, conns ...*nats.Conn) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second) // bounds a broken reconnect only
	for _, nc := range conns {
		for !nc.IsConnected() {
			if time.Now().After(deadline) {
				t.Error("no reconnect")
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		if err := nc.FlushTimeout(10 * time.Second); err != nil {
			t.Error(err)
		}
	}
}

// A Wait and a Tracker's Read pending while the service restarts (both
// are answered internal as it stops, then find no responders while it
// starts) go on waiting, and return once the input, published after the
// restart, is applied.
func TestWaitAndTrackerAcrossAServiceRestart(t *testing.T) {
	svc := clienttest.New(t)
	ctx := t.Context()
	c, nc := reconnecting(t, svc)
	const conv = "restart-wait"
	tracker := c.Track(conv)
	first := appendTurns(ctx, c, conv, 1)
	if h, err := tracker.Read(ctx, first); err != nil || len(h.Messages) != 1 {
		t.Fatalf("first read: %v %+v", err, h)
	}
	next := turn(conv, 1)
	next.ID = uuid.NewString()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	waited, read := make(chan error, 1), make(chan error, 1)
	go func() { waited <- c.Wait(wctx, conv, next.ID) }()
	go func() {
		h, err := tracker.Read(wctx, next.ID)
		if err == nil && len(h.Messages) != 2 {
			err = errors.New("the read does not hold the turn")
		}
		read <- err
	}()
	time.Sleep(200 * time.Millisecond) // both waits reach the service
	err := svc.Restart(ctx, func() {
		waitConnected(t, nc)
		time.Sleep(300 * time.Millisecond) // ask while nobody answers
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, ch := range map[string]chan error{"wait": waited, "tracker's read": read} {
		select {
		case err := <-ch:
			t.Errorf("the %s ended before its input was published: %v", name, err)
		default:
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	if _, err := c.Append(ctx, next); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("wait: %v", err)
	}
	if err := <-read; err != nil {
		t.Fatalf("tracker: %v", err)
	}
}

// A stream with Replay outlasts service restarts: it ends neither when the
// catch-up after the reconnect finds no responders nor afterwards, and
// delivers every stored event once, in order.
func TestEventsAcrossServiceRestarts(t *testing.T) {
	svc := clienttest.New(t)
	ctx := t.Context()
	c, nc := reconnecting(t, svc)
	const conv = "restart-events"
	reject := func(n int) (last string) {
		t.Helper()
		for range n {
			id, err := c.Append(ctx, badTurn(conv))
			if err != nil {
				t.Fatal(err)
			}
			last = id
		}
		return last
	}
	s, err := c.Events(ctx, conv, client.Replay(0))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got := collect(t, s, reject(3), schema.EventInputRejected)
	for range 2 {
		reject(2) // maybe committed, maybe not, when the service stops
		err := svc.Restart(ctx, func() {
			waitConnected(t, nc)
			reject(2) // in CTX_IN, for the service once it starts
			time.Sleep(300 * time.Millisecond)
		})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, collect(t, s, reject(2), schema.EventInputRejected)...)
	}
	exactlyOnceInOrder(t, ids(got), stored(t, svc, conv))
}

// A wait whose answer the service sent while the client's connection was
// down (the reply is lost with it) is asked again once the connection is
// back, rather than left hanging until its deadline.
func TestWaitWhoseReplyWasLostWithTheConnection(t *testing.T) {
	rig := newCutRig(t, 20*time.Millisecond)
	writer, c, proxy := rig.writer, rig.reader, rig.proxy
	ctx := t.Context()
	const conv = "lost-reply"
	tracker := c.Track(conv)
	first := appendTurns(ctx, writer, conv, 1)
	if _, err := tracker.Read(ctx, first); err != nil {
		t.Fatal(err)
	}
	next := turn(conv, 1)
	next.ID = uuid.NewString()
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	waited, read := make(chan error, 1), make(chan error, 1)
	go func() { waited <- c.Wait(wctx, conv, next.ID) }()
	go func() { _, err := tracker.Read(wctx, next.ID); read <- err }()
	time.Sleep(200 * time.Millisecond) // both waits reach the service
	proxy.cut()
	if _, err := writer.Append(ctx, next); err != nil {
		t.Fatal(err)
	}
	if err := writer.Wait(ctx, conv, next.ID); err != nil { // answered, into the void
		t.Fatal(err)
	}
	proxy.restore()
	start := time.Now()
	for name, ch := range map[string]chan error{"wait": waited, "tracker's read": read} {
		if err := <-ch; err != nil {
			t.Errorf("%s: %v after %v", name, err, time.Since(start))
		}
	}
}

// A service that refuses at once ("timeout: too many queries in flight from
// this tenant; retry", its answer to a tenant over its share) is asked again
// after a pause, not thousands of times a second, and an events stream goes
// on rather than ending.
func TestBusyServiceIsNotHammered(t *testing.T) {
	_, url := natstest.Run(t)
	srv := natstest.Connect(t, url)
	var history, events atomic.Int64
	refuse := func(n *atomic.Int64) nats.MsgHandler {
		return func(m *nats.Msg) {
			n.Add(1)
			_ = m.Respond([]byte(`{"error":{"code":"timeout","message":"too many queries in flight from this tenant; retry"}}`))
		}
	}
	if _, err := srv.QueueSubscribe(schema.SubjectHistory, "ctxpipe", refuse(&history)); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.QueueSubscribe(schema.SubjectEvents, "ctxpipe", refuse(&events)); err != nil {
		t.Fatal(err)
	}
	if err := srv.Flush(); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(natstest.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	if err := c.Wait(ctx, "busy", uuid.NewString()); !errors.Is(err, client.ErrTimeout) {
		t.Fatalf("Wait on a busy service: %v, want ErrTimeout", err)
	}
	if n := history.Load(); n > 30 {
		t.Fatalf("one 2 s Wait asked a busy service %d times", n)
	}
	s, err := c.Events(t.Context(), "busy", client.Replay(0))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	time.Sleep(time.Second)
	if err := s.Err(); err != nil {
		t.Fatalf("the events stream ended on a busy service: %v", err)
	}
	if n := events.Load(); n < 2 || n > 30 {
		t.Fatalf("the events catch-up asked %d times in a second", n)
	}
}
