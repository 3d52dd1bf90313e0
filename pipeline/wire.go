package pipeline

import (
	"context"
	"fmt"

	"github.com/ctxpipe/ctxpipe/bus"
)

// setup reads the partition count from CTX_IN and each file's changelog
// positions, and wires the parts that need them: per store file a
// committer, its follower and their changelog state; the ownership sized
// for N; every partition's consumer; and the first assignment.
func (r *Runner) setup(ctx context.Context) error {
	var n int
	err := bus.RetryStart(ctx, r.Log, "read "+bus.StreamIn, func(ctx context.Context) error {
		s, err := r.JS.Stream(ctx, bus.StreamIn)
		if err != nil {
			return err
		}
		n = bus.PartitionsOf(s.CachedInfo().Config)
		return nil
	})
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("stream %s has no partition transform (bus.EnsureStreams adds it)", bus.StreamIn)
	}
	r.partitions = n
	r.Stores.SetPartitions(n)
	r.own.init(n)
	r.committers = make([]*committer, r.Stores.Len())
	r.followers = make([]*follower, r.Stores.Len())
	for i, st := range r.Stores.Files() {
		pos, cursor, err := st.LogPositions(ctx)
		if err != nil {
			return err
		}
		mine := func(p int) bool { return r.Stores.FileOf(p) == i }
		// A file's positions of partitions now in another file (the
		// number of files changed) are not its to follow.
		for p := range pos {
			if !mine(p) {
				delete(pos, p)
			}
		}
		log := newLogState(n, pos, cursor)
		log.held = func(p int) bool { return mine(p) && r.own.holds.isHeld(p) }
		f := newFollower(r.JS, r.own.holds, r.Log, log, mine)
		c := &committer{i: i, st: st, log: log, follower: f, clog: r.clog,
			maxBatch: r.cfg.MaxBatch, maxBytes: r.cfg.MaxCommitBytes,
			health: &r.stored, metrics: r.Metrics, logger: r.Log,
			committed: r.committed, handled: r.own.handled}
		if r.Relays != nil {
			c.relay = r.Relays[i]
		}
		r.committers[i], r.followers[i] = c, f
	}
	if err := r.ensureConsumers(ctx); err != nil {
		return err
	}
	// Hold (and pull, once restored) only this instance's share from the
	// start, rather than everything until the first rebalance.
	var live []string
	if r.Members != nil && r.cfg.Name != "" {
		if l, err := r.Members.Live(ctx); err == nil {
			live = l
		}
	}
	r.own.assign(live)
	// Published last: other goroutines read r.committers, and r.own's
	// partitions, once they see N.
	r.own.publish(n)
	r.nParts.Store(int64(n))
	return nil
}
