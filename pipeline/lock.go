package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// LocksBucket is the KV bucket where each running instance holds its name
// (key instance.<name>): instances share the partitions, but two processes
// must never run under one name.
const LocksBucket = "ctx_locks"

// lockTTL is how long a lock outlives its holder's last refresh: a killed
// instance's lock lapses after it, and a new instance may start.
const lockTTL = 15 * time.Second

// refreshEvery is how often a holder refreshes its lock, and liveWithin how
// recent the last refresh must be for Live to count the instance.
const (
	refreshEvery = time.Second
	liveWithin   = 2500 * time.Millisecond
)

// Live lists the names of the instances whose lock was refreshed within
// liveWithin and which are not catching up: the ones that may own
// partitions now. A killed instance drops out of it within seconds, long
// before its lock lapses. It reads the watch Hold keeps (live.go), waiting
// for its first values, and fails while the watch is behind.
func (l *InstanceLock) Live(ctx context.Context) ([]string, error) {
	return l.watch.live(ctx)
}

// ErrLockHeld means another live instance runs under this name.
var ErrLockHeld = errors.New("another ctxpipe instance runs under this name")

// Holder says who holds the instance lock. Two processes with the same
// holder are the same logical instance (the same SQLite file on the same
// host), so a restart after a crash takes its own lock over at once instead
// of waiting for it to lapse.
type Holder struct {
	Host    string `json:"host"`
	DataDir string `json:"data_dir"`
	PID     int    `json:"pid"`
	Since   string `json:"since"`
	// CatchingUp is set while the instance's follower has not yet reached
	// the end CTX_STATE had when it started (CaughtUp clears it): the
	// others leave it out of the partitions' owners meanwhile, since it
	// could apply nothing of a partition before it has caught up.
	CatchingUp bool `json:"catching_up,omitempty"`
}

func (h Holder) same(o Holder) bool { return h.Host == o.Host && h.DataDir == o.DataDir }

// InstanceLock holds an instance's name while it runs. Any number of
// instances share the partitions (the server pins each partition to one),
// but two processes under one name would be taken for one in logs and
// metrics, and two on one data directory would share a SQLite file: the
// lock refuses the second with a clear error.
type InstanceLock struct {
	kv       jetstream.KeyValue
	key      string
	revision uint64
	log      *slog.Logger
	watch    *liveWatch

	mu sync.Mutex
	me Holder
}

// CaughtUp tells the other instances, from the next refresh on, that this
// one may own partitions.
func (l *InstanceLock) CaughtUp() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.me.CatchingUp = false
}

func (l *InstanceLock) value() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	val, _ := json.Marshal(l.me)
	return val
}

// AcquireLock takes the lock for the instance name, or returns an error
// wrapping ErrLockHeld that names the holder. replicas sizes the lock bucket
// when it is created (match the streams').
func AcquireLock(ctx context.Context, js jetstream.JetStream, name string, me Holder, replicas int, log *slog.Logger) (*InstanceLock, error) {
	kv, err := js.KeyValue(ctx, LocksBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:      LocksBucket,
			Description: "ctxpipe: the names of the running instances",
			History:     1,
			TTL:         lockTTL,
			Storage:     jetstream.FileStorage,
			Replicas:    max(replicas, 1),
		})
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, LocksBucket)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("lock bucket %s: %w", LocksBucket, err)
	}
	l := &InstanceLock{kv: kv, key: "instance." + name, me: me, log: log, watch: newLiveWatch()}
	if me.Since == "" {
		l.me.Since = time.Now().UTC().Format(time.RFC3339)
	}
	val := l.value()
	rev, err := kv.Create(ctx, l.key, val)
	if errors.Is(err, jetstream.ErrKeyExists) {
		e, gerr := kv.Get(ctx, l.key)
		if gerr != nil {
			return nil, fmt.Errorf("read lock %s: %w", l.key, gerr)
		}
		var other Holder
		_ = json.Unmarshal(e.Value(), &other)
		if !other.same(me) {
			return nil, fmt.Errorf("%w %q: host %q, data dir %q, pid %d, since %s (give each instance its own --name and --data-dir; the lock lapses %v after its holder stops)",
				ErrLockHeld, name, other.Host, other.DataDir, other.PID, other.Since, lockTTL)
		}
		rev, err = kv.Update(ctx, l.key, val, e.Revision())
	}
	if err != nil {
		return nil, fmt.Errorf("take lock %s: %w", l.key, err)
	}
	l.revision = rev
	return l, nil
}

// Hold refreshes the lock until ctx is done, then releases it. It returns
// an error wrapping ErrLockHeld if another instance took the lock meanwhile
// (this one was cut off from NATS for longer than the lock's TTL): the
// caller must stop consuming.
func (l *InstanceLock) Hold(ctx context.Context) error {
	// Refreshed often: a refresh is also the sign of life other instances
	// read (Live) to decide which partitions to hand over.
	go l.watch.run(ctx, l.kv, func(err error) {
		l.log.Warn("watching the instance locks failed; watching again", "err", err)
	})
	t := time.NewTicker(refreshEvery)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			dctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if err := l.kv.Delete(dctx, l.key, jetstream.LastRevision(l.revision)); err != nil {
				l.log.Debug("release lock", "err", err)
			}
			return nil
		case <-t.C:
		}
		val := l.value()
		uctx, cancel := context.WithTimeout(ctx, lockTTL/3)
		rev, err := l.kv.Update(uctx, l.key, val, l.revision)
		cancel()
		switch {
		case err == nil:
			l.revision = rev
			if failing {
				l.log.Info("instance lock refreshed again", "key", l.key)
				failing = false
			}
		case ctx.Err() != nil:
		case errors.Is(err, jetstream.ErrKeyExists):
			// Wrong last revision: the lock lapsed while this instance was
			// cut off. Take it again unless another instance did.
			if err := l.retake(ctx, val); err != nil {
				return err
			}
			if failing {
				l.log.Info("instance lock taken again", "key", l.key)
				failing = false
			}
		default:
			if !failing {
				l.log.Warn("cannot refresh the instance lock; retrying", "key", l.key, "err", err)
			}
			failing = true
		}
	}
}

// retake takes the lock again after it lapsed; it fails with ErrLockHeld if
// another instance holds it now.
func (l *InstanceLock) retake(ctx context.Context, val []byte) error {
	e, err := l.kv.Get(ctx, l.key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		rev, err := l.kv.Create(ctx, l.key, val)
		if err != nil {
			return fmt.Errorf("%w: lock %s lapsed and was taken: %v", ErrLockHeld, l.key, err)
		}
		l.revision = rev
		return nil
	case err != nil:
		return nil // transient: the next tick tries again
	}
	var other Holder
	_ = json.Unmarshal(e.Value(), &other)
	if !other.same(l.me) {
		return fmt.Errorf("%w: lock %s was taken over by host %q, data dir %q while this instance was cut off",
			ErrLockHeld, l.key, other.Host, other.DataDir)
	}
	l.revision = e.Revision()
	return nil
}
