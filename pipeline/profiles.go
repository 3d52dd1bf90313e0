package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/schema"
)

// Profiles is the live set of profiles, mirrored from the ctx_profiles KV
// bucket so that every instance sees the same settings and a change applies
// without a restart.
type Profiles struct {
	mu sync.RWMutex
	m  map[string]schema.Profile
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
func WatchProfiles(ctx context.Context, kv jetstream.KeyValue, log *slog.Logger) (*Profiles, error) {
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return nil, fmt.Errorf("watch profiles: %w", err)
	}
	p := StaticProfiles()
	apply := func(e jetstream.KeyValueEntry) {
		if e.Operation() != jetstream.KeyValuePut {
			p.set(e.Key(), nil)
			return
		}
		x, err := schema.DecodeProfile(e.Value())
		if err != nil {
			log.Warn("ignoring an invalid profile", "key", e.Key(), "err", err)
			return
		}
		if x.ID != e.Key() {
			log.Warn("ignoring a profile whose id is not its key", "key", e.Key(), "id", x.ID)
			return
		}
		p.set(x.ID, &x)
		log.Info("profile loaded", "id", x.ID, "window", x.ContextWindow, "strategy", x.StrategyOrDefault())
	}
	// The initial values end with a nil entry.
	for e := range w.Updates() {
		if e == nil {
			break
		}
		apply(e)
	}
	go func() {
		defer w.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e != nil {
					apply(e)
				}
			}
		}
	}()
	return p, nil
}
