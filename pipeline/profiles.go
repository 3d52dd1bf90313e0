package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/internal/backoff"
	"github.com/ctxpipe/ctxpipe/schema"
)

// Profiles is the live set of profiles, mirrored from the ctx_profiles KV
// bucket so that every instance sees the same settings and a change applies
// without a restart.
type Profiles struct {
	mu sync.RWMutex
	m  map[string]schema.Profile
	// kv is the bucket behind a watched set: a profile the watch has not
	// delivered yet is read from it directly.
	kv  jetstream.KeyValue
	log *slog.Logger
}

// StaticProfiles returns a fixed set (for in-process use and tests).
func StaticProfiles(ps ...schema.Profile) *Profiles {
	p := &Profiles{m: map[string]schema.Profile{}}
	for _, x := range ps {
		p.m[x.ID] = x
	}
	return p
}

// Get returns a profile by id.
func (p *Profiles) Get(id string) (schema.Profile, bool) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	x, ok := p.m[id]
	return x, ok
}

// Lookup returns a profile by id. A profile the set does not have is read
// from the bucket before it is called unknown: after a broker restart the
// watch may not have delivered it yet. An error means the bucket could not
// be read and the caller should retry.
func (p *Profiles) Lookup(ctx context.Context, id string) (schema.Profile, bool, error) {
	if x, ok := p.Get(id); ok || p.kv == nil {
		return x, ok, nil
	}
	if !schema.ValidProfileID(id) {
		// No profile has it, and asking the bucket for it could cost the
		// connection: a key of kilobytes makes a subject the server refuses
		// by closing the connection, which would take the service's
		// connection down for one turn's profile id.
		return schema.Profile{}, false, nil
	}
	e, err := p.kv.Get(ctx, id)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted), errors.Is(err, jetstream.ErrInvalidKey):
		return schema.Profile{}, false, nil
	case err != nil:
		return schema.Profile{}, false, fmt.Errorf("read profile %q: %w", id, err)
	}
	x, err := schema.DecodeProfile(e.Value())
	if err != nil || x.ID != id {
		return schema.Profile{}, false, nil
	}
	p.set(id, &x)
	return x, true, nil
}

// IDs lists the profile ids.
func (p *Profiles) IDs() []string {
	p.mu.RLock()
	defer p.mu.RUnlock()
	out := make([]string, 0, len(p.m))
	for id := range p.m {
		out = append(out, id)
	}
	return out
}

func (p *Profiles) set(id string, x *schema.Profile) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if x == nil {
		delete(p.m, id)
		return
	}
	p.m[id] = *x
}

// SeedProfiles writes the profiles that the bucket does not have yet. It
// never overwrites one: a profile changed at run time wins over the file.
func SeedProfiles(ctx context.Context, kv jetstream.KeyValue, ps []schema.Profile) error {
	for _, x := range ps {
		if err := x.Validate(); err != nil {
			return err
		}
		b, err := schema.Marshal(x)
		if err != nil {
			return err
		}
		if _, err := kv.Create(ctx, x.ID, b); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
			return fmt.Errorf("seed profile %q: %w", x.ID, err)
		}
	}
	return nil
}

// WatchProfiles loads every profile in the bucket and keeps the set current
// until ctx ends. An invalid profile document is logged and ignored (the
// previous version of that profile stays in force).
//
// The watch is started again whenever reconnected delivers (the caller
// passes nc.StatusChanged(nats.CONNECTED)) and whenever it ends by itself:
// after a broker restart the old watch's consumer is gone, and waiting for
// its heartbeats to time out left profiles unseen for 15 s.
func WatchProfiles(ctx context.Context, kv jetstream.KeyValue, log *slog.Logger, reconnected <-chan nats.Status) (*Profiles, error) {
	p := StaticProfiles()
	p.kv, p.log = kv, log
	w, err := p.watch(ctx, true)
	if err != nil {
		return nil, err
	}
	go func() {
		retry := backoff.New(backoff.Policy{First: 100 * time.Millisecond, Max: 5 * time.Second, Jitter: true})
		for {
			ended := w != nil && p.follow(ctx, w, reconnected)
			if w != nil {
				_ = w.Stop()
			}
			if ctx.Err() != nil {
				return
			}
			if ended {
				log.Warn("profile watch ended; watching again")
			}
			if w, err = p.watch(ctx, false); err != nil {
				wait := retry.Next()
				log.Error("cannot watch profiles; retrying", "err", err, "retry_in", wait)
				select {
				case <-ctx.Done():
					return
				case <-time.After(wait):
				}
				continue
			}
			retry.Reset()
			log.Info("watching profiles again", "profiles", len(p.IDs()))
		}
	}()
	return p, nil
}

// watch starts a watch and applies the bucket's current values. It logs
// each profile only at the first start, not at every rewatch.
func (p *Profiles) watch(ctx context.Context, first bool) (jetstream.KeyWatcher, error) {
	w, err := p.kv.WatchAll(ctx)
	if err != nil {
		return nil, fmt.Errorf("watch profiles: %w", err)
	}
	// The initial values end with a nil entry.
	for e := range w.Updates() {
		if e == nil {
			break
		}
		p.apply(e, first)
	}
	if first {
		p.log.Info("profiles loaded", "ids", p.IDs())
	}
	return w, nil
}

// follow applies updates until ctx ends (false), the watch's channel closes
// (true) or the connection comes back after a disconnect (false).
func (p *Profiles) follow(ctx context.Context, w jetstream.KeyWatcher, reconnected <-chan nats.Status) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case <-reconnected:
			return false
		case e, ok := <-w.Updates():
			if !ok {
				return true
			}
			if e != nil {
				p.apply(e, true)
			}
		}
	}
}

func (p *Profiles) apply(e jetstream.KeyValueEntry, verbose bool) {
	if e.Operation() != jetstream.KeyValuePut {
		p.set(e.Key(), nil)
		return
	}
	x, err := schema.DecodeProfile(e.Value())
	if err != nil {
		p.log.Warn("ignoring an invalid profile", "key", e.Key(), "err", err)
		return
	}
	if x.ID != e.Key() {
		p.log.Warn("ignoring a profile whose id is not its key", "key", e.Key(), "id", x.ID)
		return
	}
	if old, ok := p.Get(x.ID); verbose && (!ok || !sameProfile(old, x)) {
		p.log.Debug("profile updated", "id", x.ID, "window", x.ContextWindow, "strategy", x.StrategyOrDefault())
	}
	p.set(x.ID, &x)
}

func sameProfile(a, b schema.Profile) bool {
	x, _ := schema.Marshal(a)
	y, _ := schema.Marshal(b)
	return string(x) == string(y)
}
