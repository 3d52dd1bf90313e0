package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/internal/backoff"
)

// The live instances are read from a watch of ctx_locks kept open for the
// lock's life: every refresh of every instance's lock reaches every
// instance as it is stored, and the list is computed from what the watch
// last delivered. Listing the bucket instead (a new consumer on the server,
// then one request per key) every second cost each instance a steady share
// of its idle CPU, and the server more.

// lockSeen is an instance's lock as the watch last delivered it.
type lockSeen struct {
	at         time.Time // when the server stored it (the refresh)
	catchingUp bool
}

// liveAt lists, sorted, the instances whose lock was refreshed within
// liveWithin of now and which are not catching up.
func liveAt(seen map[string]lockSeen, now time.Time) []string {
	var names []string
	for name, s := range seen {
		if now.Sub(s.at) <= liveWithin && !s.catchingUp {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// watchCurrent tells whether the watch is up to date: it delivered a
// refresh within liveWithin of now (by this instance's clock: every live
// instance, this one included, refreshes its lock every refreshEvery, and
// each refresh comes through the watch). A watch that stopped delivering
// would otherwise show every other instance dead, and this one would take
// their partitions.
func watchCurrent(lastDelivery, now time.Time) error {
	switch {
	case lastDelivery.IsZero():
		return fmt.Errorf("the watch of %s has delivered nothing yet", LocksBucket)
	case now.Sub(lastDelivery) > liveWithin:
		return fmt.Errorf("the watch of %s has delivered nothing for %v", LocksBucket, now.Sub(lastDelivery).Round(time.Millisecond))
	}
	return nil
}

// liveWatch keeps the locks the watch delivered.
type liveWatch struct {
	mu     sync.Mutex
	seen   map[string]lockSeen
	last   time.Time     // when the watch last delivered a refresh (local clock)
	loaded chan struct{} // closed once the bucket's current keys are in
	once   sync.Once
}

func newLiveWatch() *liveWatch {
	return &liveWatch{seen: map[string]lockSeen{}, loaded: make(chan struct{})}
}

// put records one delivered entry; a nil one ends the initial values.
func (w *liveWatch) put(e jetstream.KeyValueEntry) {
	if e == nil {
		w.once.Do(func() { close(w.loaded) })
		return
	}
	name, ok := strings.CutPrefix(e.Key(), "instance.")
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.last = time.Now()
	if e.Operation() != jetstream.KeyValuePut {
		delete(w.seen, name)
		return
	}
	var h Holder
	if json.Unmarshal(e.Value(), &h) != nil {
		return
	}
	w.seen[name] = lockSeen{at: e.Created(), catchingUp: h.CatchingUp}
	// A lock that lapsed is gone from the bucket without a delete marker:
	// forget it here too.
	for n, s := range w.seen {
		if e.Created().Sub(s.at) > lockTTL {
			delete(w.seen, n)
		}
	}
}

// live lists the live instances once the watch has loaded (or ctx ends),
// or fails when the watch is behind.
func (w *liveWatch) live(ctx context.Context) ([]string, error) {
	select {
	case <-w.loaded:
	case <-ctx.Done():
		return nil, fmt.Errorf("list instances: %w", ctx.Err())
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	if err := watchCurrent(w.last, now); err != nil {
		return nil, err
	}
	return liveAt(w.seen, now), nil
}

// run watches the instance locks until ctx ends, starting the watch again
// after a failure, or when it has delivered nothing for restartStale (not
// even this instance's own refreshes): a watch that stopped delivering
// without failing would otherwise leave Live failing, and the instance
// keeping its last assignment, for good.
func (w *liveWatch) run(ctx context.Context, kv jetstream.KeyValue, onErr func(error)) {
	retry := backoff.New(backoff.Policy{First: 250 * time.Millisecond, Max: 5 * time.Second, Jitter: true})
	for ctx.Err() == nil {
		began := time.Now()
		err := w.watchOnce(ctx, kv)
		if ctx.Err() != nil {
			return
		}
		onErr(err)
		if time.Since(began) > time.Minute {
			retry.Reset()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry.Next()):
		}
	}
}

// restartStale is how long the watch may go without delivering before it
// is started again: every live instance, this one included, refreshes its
// lock every refreshEvery, so a watch that shows none of them for longer
// than liveWithin is behind (Live fails from then on), and one more
// refreshEvery is the margin for this instance's own refresh. A node lost
// under the watch's consumer leaves it silent, and a survivor blind to a
// dead instance until the watch is started again.
const restartStale = liveWithin + refreshEvery

// watchStale tells whether a watch started at started, which last
// delivered at last (zero: never), has gone silent for longer than
// restartStale at now.
func watchStale(started, last, now time.Time) error {
	since := started
	if last.After(since) {
		since = last
	}
	if d := now.Sub(since); d > restartStale {
		if last.IsZero() || last.Before(started) {
			return fmt.Errorf("the watch of %s has delivered nothing for %v since it started", LocksBucket, d.Round(time.Millisecond))
		}
		return fmt.Errorf("the watch of %s has delivered nothing for %v", LocksBucket, d.Round(time.Millisecond))
	}
	return nil
}

func (w *liveWatch) watchOnce(ctx context.Context, kv jetstream.KeyValue) error {
	kw, err := kv.Watch(ctx, "instance.*")
	if err != nil {
		return fmt.Errorf("watch %s: %w", LocksBucket, err)
	}
	defer func() { _ = kw.Stop() }()
	started := time.Now()
	t := time.NewTicker(refreshEvery / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-kw.Updates():
			if !ok {
				return errors.New("the watch of " + LocksBucket + " ended")
			}
			w.put(e)
		case now := <-t.C:
			w.mu.Lock()
			last := w.last
			w.mu.Unlock()
			if err := watchStale(started, last, now); err != nil {
				return err
			}
		}
	}
}
