package pipeline

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/changelog"
	"github.com/ctxpipe/ctxpipe/internal/backoff"
)

// follower reads the changelog of the partitions of one store file this
// instance holds into the file's committer: one ordered consumer filtered
// on their subjects, started again when the set changes, after failures,
// and when the committer asks (after it failed to apply).
type follower struct {
	js     jetstream.JetStream
	holds  *holding
	logger *slog.Logger
	// log is the file's changelog state, and mine tells which partitions
	// are the file's.
	log  *logState
	mine func(p int) bool
	out  chan followed
	// gen counts the times the committer asked to read again (retry) or
	// the set of partitions changed: what an earlier run sent and nobody
	// read yet is stale then, and the committer drops it (taken after a
	// retry, its records would be applied ahead of the ones the retry
	// reads again, which would then look applied; seen as a partition
	// missing one record).
	gen atomic.Uint64

	mu     sync.Mutex
	cancel context.CancelFunc
	// refollow is set when the run was stopped for a new set of
	// partitions, not for a failure: the next starts at once.
	refollow bool
	// floor is, per partition being restored, the sequence its run began
	// at: a run started again must not begin after it until the partition
	// is restored (the cursor, moved by the other partitions, says nothing
	// of it).
	floor map[int]uint64
	// started is set once a run was planned: before, the cursor the store
	// kept says nothing of the partitions held now.
	started bool
	// prog is what the current run did, for the line that says a
	// follower is stalled.
	prog followProgress
}

// followProgress is what a follower run did: when it began, how many items
// it handed to the committer and when the last, and since when it waits to
// hand one over (0: it does not); times in Unix nanoseconds, 0 for none.
// Nothing handed over says the consumer delivers nothing; a long wait says
// the committer takes nothing. Atomics: the run writes them for every item.
type followProgress struct {
	began, lastSent, handing atomic.Int64
	sent                     atomic.Uint64
}

// start resets the progress for a run beginning now.
func (pr *followProgress) start() {
	pr.began.Store(time.Now().UnixNano())
	pr.lastSent.Store(0)
	pr.handing.Store(0)
	pr.sent.Store(0)
}

// progress describes the current run for a log line.
func (f *follower) progress() []any {
	pr := &f.prog
	now := time.Now().UnixNano()
	ago := func(at int64, none string) string {
		if at == 0 {
			return none
		}
		return time.Duration(now - at).Round(time.Millisecond).String()
	}
	return []any{"run_began", ago(pr.began.Load(), "none"), "items_handed", pr.sent.Load(), "last_handed", ago(pr.lastSent.Load(), "never"),
		"handing_for", ago(pr.handing.Load(), "not handing")}
}

// followed is a changelog item with the generation of the follower run
// that read it.
type followed struct {
	changelog.Item
	gen uint64
}

func newFollower(js jetstream.JetStream, holds *holding, logger *slog.Logger, log *logState, mine func(p int) bool) *follower {
	return &follower{js: js, holds: holds, logger: logger, log: log, mine: mine, out: make(chan followed, 1024), floor: map[int]uint64{}}
}

// followPlan is one run: the partitions' subjects, where it starts, and
// whether it needs the messages' data (a partition being restored, or
// followed as a standby, does).
type followPlan struct {
	subjects    []string
	from        uint64
	headersOnly bool
}

// slowPlan is how long the gained partitions' last messages may take to
// read before plan says so: a restore waits for them.
const slowPlan = 500 * time.Millisecond

// plan decides the next run. Each gained partition's target is its last
// changelog message; when the store holds it already the partition is
// restored at once and followed from the end of the log as it was before
// the target was read (nothing of it lies between), else from after the
// store's last record of it.
func (f *follower) plan(ctx context.Context) (followPlan, error) {
	gained, held := f.holds.take(f.mine)
	f.mu.Lock()
	started := f.started
	f.mu.Unlock()
	from := uint64(0)
	if started {
		from = f.log.safeCursor() + 1
	}
	if len(gained) > 0 {
		ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		s, err := f.js.Stream(ictx, bus.StreamState)
		if err != nil {
			f.holds.untake(gained)
			return followPlan{}, fmt.Errorf("changelog info: %w", err)
		}
		end := s.CachedInfo().State.LastSeq
		t0 := time.Now()
		lasts, err := changelog.LastOfEach(ictx, s, gained)
		if err != nil {
			f.holds.untake(gained)
			return followPlan{}, err
		}
		if took := time.Since(t0); took > slowPlan {
			f.logger.Info("reading the last changelog messages of the partitions gained was slow", "partitions", len(gained), "took", took.Round(time.Millisecond))
		}
		for i, p := range gained {
			last := lasts[i]
			start, current := restoreFrom(last, f.log.appliedOf(p), end)
			if !current {
				f.mu.Lock()
				f.floor[p] = start
				f.mu.Unlock()
			}
			if f.holds.plan(p, last, current) {
				f.logger.Debug("partition held", "partition", p, "changelog_last", last)
			}
			if from == 0 || start < from {
				from = start
			}
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.started = true
	restoring := f.holds.restoring()
	for p := range f.floor {
		if !containsInt(restoring, p) {
			delete(f.floor, p)
		}
	}
	for _, at := range f.floor {
		from = min(from, at)
	}
	// Headers only when every record followed is expected to be this
	// instance's own (it owns every partition it holds, none restoring):
	// a direct get per record of another writer costs a round trip, more
	// than receiving this instance's own records back unread.
	pl := followPlan{from: max(from, 1), headersOnly: len(restoring) == 0 && !f.holds.standing()}
	for _, p := range held {
		pl.subjects = append(pl.subjects, bus.StateSubject(p))
	}
	return pl, nil
}

// restoreFrom is where a gained partition is followed from, given its last
// changelog message, the last of its records the store applied, and the
// log's end before last was read: when the store holds last already the
// partition is current, and followed from after the end (nothing of it
// lies between); otherwise from after its last record applied.
func restoreFrom(last, applied, end uint64) (start uint64, current bool) {
	if last <= applied {
		return end + 1, true
	}
	return applied + 1, false
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func (f *follower) run(ctx context.Context) {
	defer close(f.out)
	retry := backoff.New(backoff.Policy{First: 250 * time.Millisecond, Max: 2 * time.Second, Jitter: true})
	// A retry (the committer could not apply what was read) restarts the
	// run after a pause, doubling from 50 ms to 2 s while runs keep ending
	// within seconds: the store is failing then (a full disk), and
	// restarting at once made 150 runs a second, each a new ordered
	// consumer on CTX_STATE, up to the server's consumer limit.
	restarts := backoff.New(backoff.Policy{First: 50 * time.Millisecond, Max: 2 * time.Second, Jitter: true})
	for ctx.Err() == nil {
		started := time.Now()
		fctx, cancel := context.WithCancel(ctx)
		f.mu.Lock()
		f.cancel, f.refollow = cancel, false
		f.mu.Unlock()
		gen := f.gen.Load()
		pl, err := f.plan(fctx)
		if err == nil && len(pl.subjects) == 0 {
			// Nothing held: wait for a change.
			<-fctx.Done()
			err = fctx.Err()
		}
		if err == nil {
			items := make(chan changelog.Item)
			forwarded := make(chan struct{})
			f.prog.start()
			go func() {
				defer close(forwarded)
				for it := range items {
					f.prog.handing.Store(time.Now().UnixNano())
					select {
					case f.out <- followed{it, gen}:
					case <-fctx.Done():
						return // stale now, or stopping
					}
					f.prog.handing.Store(0)
					f.prog.lastSent.Store(time.Now().UnixNano())
					f.prog.sent.Add(1)
				}
			}()
			err = changelog.FollowLive(fctx, f.js, pl.subjects, pl.from, pl.headersOnly, f.log.has, items)
			close(items)
			<-forwarded // the next run's items come after this one's
		}
		restarted := fctx.Err() != nil && ctx.Err() == nil
		f.mu.Lock()
		refollow := f.refollow
		f.mu.Unlock()
		cancel()
		if ctx.Err() != nil {
			return
		}
		if restarted {
			if refollow || time.Since(started) > 5*time.Second {
				restarts.Reset()
				continue
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(restarts.Next()):
			}
			continue
		}
		wait := retry.Next()
		f.logger.Warn("following the changelog failed; following again", "from", pl.from, "err", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// current tells whether it was read after the last retry.
func (f *follower) current(it followed) bool { return it.gen == f.gen.Load() }

// retry makes the follower read again from the cursor; what it sent
// before is dropped.
func (f *follower) retry() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gen.Add(1)
	if f.cancel != nil {
		f.cancel()
	}
}

// follow makes the follower start a run for the partitions held now.
func (f *follower) follow() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gen.Add(1)
	f.refollow = true
	if f.cancel != nil {
		f.cancel()
	}
}

// Cursor is how far this instance has read the changelog (0 before Run):
// the least cursor of its files that hold a partition now. A file holding
// none follows nothing, and its cursor stands still where it was.
func (r *Runner) Cursor() uint64 {
	if r.nParts.Load() == 0 {
		return 0
	}
	logs := make([]*logState, len(r.committers))
	for i, c := range r.committers {
		logs[i] = c.log
	}
	return leastCursor(logs)
}

// leastCursor is the least cursor of the logs that hold a partition (0
// when none does).
func leastCursor(logs []*logState) uint64 {
	var cur uint64
	first := true
	for _, ls := range logs {
		if !ls.holdsAny() {
			continue
		}
		if at := ls.safeCursor(); first || at < cur {
			cur, first = at, false
		}
	}
	return cur
}

// Behind is how many partitions this instance holds whose last changelog
// message it has not handled yet (0 when it holds none, or has caught up
// with all).
func (r *Runner) Behind(ctx context.Context) (int, error) {
	if r.nParts.Load() == 0 {
		return 0, nil
	}
	s, err := r.JS.Stream(ctx, bus.StreamState)
	if err != nil {
		return 0, err
	}
	n := 0
	for p := range r.own.parts {
		if !r.own.holds.isHeld(p) {
			continue
		}
		last, err := changelog.LastOf(ctx, s, p)
		if err != nil {
			return 0, err
		}
		if err := r.logOf(p).waitSeen(doneCtx, p, last); err != nil {
			n++
		}
	}
	return n, nil
}

// doneCtx is a context already done: waitSeen with it only checks.
var doneCtx = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()
