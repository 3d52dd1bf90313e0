package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/changelog"
	"github.com/ctxpipe/ctxpipe/engine"
	"github.com/ctxpipe/ctxpipe/internal/backoff"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/store"
)

// Deps are the runner's collaborators.
type Deps struct {
	JS jetstream.JetStream
	// Store is the state in one file; Stores, when set, the state split
	// over files by partition (store.Set), and Store is then ignored.
	Store    *store.Store
	Stores   *store.Set
	Engine   *engine.Engine
	Profiles *Profiles
	// Relay is kicked after every commit so events leave at once; optional.
	// Relays, when set, are the relays of Stores' files, in their order.
	Relay   *store.Relay
	Relays  []*store.Relay
	Log     *slog.Logger
	Metrics *Metrics
	// Members lists the running instances, for rebalancing; optional.
	Members Members
}

// Runner consumes CTX_IN and applies each input. Its job, in this file:
// each partition's pinned consumer is pulled (partitions.go) and every
// input fetched is dispatched to the scheduler (sched.go), which hands one
// conversation at a time to a worker (a lane); the worker prepares the
// batch (prepare.go), hands it to the committer of the partition's file
// (committer.go) and acks it once committed, retrying what failed
// (retry.go). Everything else it wires: ownership (balance.go), the
// followers (follower.go), the query server (queries.go).
type Runner struct {
	cfg Config
	Deps
	waiters *waiters
	health  health
	// stored is the store's health as the committers see it.
	stored storeHealth
	// prep prepares the workers' batches.
	prep *preparer
	// queries answers the ctx.q.* queries and the dashboard's reads.
	queries *queryServer

	sched *scheduler
	// committers are the committers of Stores' files, in the set's order,
	// and followers their followers; made by setup.
	committers []*committer
	followers  []*follower

	// partitions is N, as CTX_IN's transform has it; partition N is the
	// shared one (inputs without a tenant).
	partitions int
	nParts     atomic.Int64 // partitions, for other goroutines
	clog       *changelog.Log
	// failing counts the partitions whose consumer is being rebuilt.
	failing atomic.Int64
	// own is which partitions this instance holds and pulls.
	own *ownership

	// held are the inputs fetched and not yet acked or given back.
	held *heldInputs
	// replays are the inputs term starts read again and committed.
	replays *replays
}

// New returns a runner; Run starts it.
func New(cfg Config, d Deps) (*Runner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if d.JS == nil || (d.Store == nil && d.Stores == nil) || d.Engine == nil || d.Profiles == nil {
		return nil, errors.New("pipeline: JS, Store (or Stores), Engine and Profiles are required")
	}
	if d.Stores == nil {
		d.Stores = store.NewSet(d.Store)
	}
	if d.Relays == nil && d.Relay != nil {
		d.Relays = []*store.Relay{d.Relay}
	}
	if d.Relays != nil && len(d.Relays) != d.Stores.Len() {
		return nil, fmt.Errorf("pipeline: %d relays for %d store files", len(d.Relays), d.Stores.Len())
	}
	if d.Log == nil {
		d.Log = slog.Default()
	}
	r := &Runner{cfg: cfg, Deps: d, waiters: newWaiters(), replays: newReplays(), held: newHeldInputs(cfg.MaxHeldBytes, cfg.AckWait, d.Log), clog: &changelog.Log{JS: d.JS, MaxPiece: cfg.MaxLogPiece}}
	r.own = &ownership{name: cfg.Name, standby: cfg.Standby, rebalanceEvery: cfg.RebalanceEvery, catchUpTimeout: cfg.CatchUpTimeout,
		members: d.Members, logger: d.Log, metrics: d.Metrics,
		heldChanged: func() {
			for _, f := range r.followers {
				f.follow()
			}
		},
		pullChanged: func() { r.queries.syncOwned() }}
	r.prep = &preparer{stores: d.Stores, profiles: d.Profiles, engine: d.Engine, maxInputBytes: cfg.MaxInputBytes, maxDeliver: cfg.MaxDeliver,
		logger: d.Log, metrics: d.Metrics}
	r.queries = &queryServer{stores: d.Stores, profiles: d.Profiles, engine: d.Engine, waiters: r.waiters, parts: r.own, js: d.JS,
		name: cfg.Name, maxReads: cfg.MaxQueryReads, maxWaits: cfg.MaxQueryWaits, logger: d.Log, metrics: d.Metrics}
	describeMetrics(r)
	return r, nil
}

// Run consumes until ctx is done, then stops gracefully: no new fetches,
// workers finish (or give back, past ShutdownTimeout) what they hold, and
// the last commits complete. It returns nil after a graceful stop.
//
// Run survives what a live cluster does to a consumer (missed heartbeats, a
// leader change, the consumer deleted, the JetStream API timing out): it
// rebuilds the consumer with backoff and goes on. It returns an error only
// when it cannot go on at all (the connection was closed); the caller
// should then exit so that a supervisor restarts the process.
func (r *Runner) Run(ctx context.Context) error {
	// Workers keep working after ctx ends, until the queues are empty or
	// the shutdown timeout passes: then work is cancelled and what is left
	// is given back to JetStream.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	if err := r.setup(ctx); err != nil {
		r.health.stopped()
		if ctx.Err() != nil {
			return nil // stopped while starting
		}
		return err
	}
	r.sched = newScheduler()
	followCtx, stopFollowing := context.WithCancel(context.WithoutCancel(ctx))
	defer stopFollowing()
	for i, c := range r.committers {
		c.commits = make(chan *commitReq, r.cfg.Lanes)
		go r.followers[i].run(followCtx)
	}
	go r.own.catchUp(followCtx)
	var workers, committers sync.WaitGroup
	for range r.cfg.Lanes {
		workers.Add(1)
		go func() {
			defer workers.Done()
			r.worker(work)
		}()
	}
	for i, c := range r.committers {
		committers.Add(1)
		go func() {
			defer committers.Done()
			// Labelled so that a CPU profile tells each file's serial
			// work apart (go tool pprof -tagfocus file=i).
			pprof.Do(ctx, pprof.Labels("file", strconv.Itoa(i)), func(context.Context) {
				c.run(r.followers[i].out)
			})
		}()
	}
	hbDone := make(chan struct{})
	go r.held.heartbeat(hbDone)

	err := r.consume(ctx)

	r.sched.close()
	stopped := make(chan struct{})
	go func() {
		workers.Wait()
		close(stopped)
	}()
	t := time.NewTimer(r.cfg.ShutdownTimeout)
	select {
	case <-stopped:
	case <-t.C:
		cancelWork()
		<-stopped
	}
	t.Stop()
	for _, c := range r.committers {
		close(c.commits)
	}
	stopFollowing()
	committers.Wait()
	close(hbDone)
	r.health.stopped()
	if err != nil {
		r.Log.Error("consumer stopped", "err", err)
		return err
	}
	r.Log.Info("consumer stopped")
	return nil
}

// dispatch queues an input fetched from partition p (by its consumer, or a
// term's replay) behind its conversation's earlier ones, once the held
// bytes leave it room.
func (r *Runner) dispatch(p int, msg jetstream.Msg) {
	now := time.Now()
	j := &job{msg: msg, partition: p, touched: now, fetched: now}
	if md, err := msg.Metadata(); err == nil {
		j.seq, j.deliver, j.stored = md.Sequence.Stream, md.NumDelivered, md.Timestamp
		if j.deliver > 1 {
			r.Metrics.Inc("ctxpipe_redeliveries_total", "")
		}
	}
	_, j.subject, _ = bus.SplitInputSubject(msg.Subject(), r.partitions)
	if conv, _, err := schema.ParseSubject(j.subject); err == nil || conv != "" {
		j.conv = conv
	}
	r.held.hold(j)
	r.sched.push(j)
}

// worker applies one conversation's waiting inputs at a time, in order:
// against an in-memory overlay of the not-yet-committed results, then one
// commit, then the acks.
func (r *Runner) worker(ctx context.Context) {
	for {
		conv, batch := r.sched.take(r.cfg.LaneBatch)
		if batch == nil {
			return
		}
		if ctx.Err() != nil {
			r.giveBack(batch)
		} else if batch = r.skipReplayed(batch); len(batch) > 0 {
			r.handle(ctx, batch)
		}
		r.sched.release(conv)
	}
}

// handle prepares and commits a conversation's batch, then acks it,
// retrying failures of the service with backoff within the retry budget
// (afterFailure): a batch that fails is split so that one bad input cannot
// hold back the others; a single input that keeps failing is rejected as
// poison.
func (r *Runner) handle(ctx context.Context, batch []*job) {
	start, retry := time.Now(), backoff.New(commitRetry)
	behind := 0
	for {
		p := batch[0].partition
		seen := r.logOf(p).foreignMark(p)
		t0 := time.Now()
		entries, err := r.prep.prepare(ctx, batch)
		t1 := time.Now()
		if err == nil {
			err = r.commit(p, seen, entries)
		}
		if err == nil {
			r.stages(batch, start, t0, t1, time.Now())
			r.ack(batch)
			return
		}
		if ctx.Err() != nil {
			// Shutdown: the whole queue is given back, in order.
			r.giveBack(batch)
			return
		}
		r.Metrics.Inc("ctxpipe_retries_total", "")
		step := afterFailure(err, len(batch), time.Since(start), r.cfg.RetryBudget)
		if step == retryFollowed {
			if behind == 0 {
				r.Log.Warn("changelog ahead of the store; preparing again once the follower applied it", "inputs", len(batch), "partition", p)
			}
			behind++
			wctx, cancel := context.WithTimeout(ctx, behindWait)
			_ = r.logOf(p).waitForeign(wctx, p, seen)
			cancel()
			if ctx.Err() != nil {
				r.giveBack(batch)
				return
			}
			continue
		}
		wait := retry.Next()
		r.Log.Warn("transient failure; retrying", "inputs", len(batch), "err", err, "backoff", wait)
		switch step {
		case retrySplit:
			for i, j := range batch {
				if ctx.Err() != nil {
					// Not one of them may go on after another was given back.
					r.giveBack(batch[i:])
					return
				}
				r.handle(ctx, []*job{j})
			}
			return
		case retryPoison:
			if r.poison(batch[0], err) {
				return
			}
		}
		if backoff.Sleep(ctx, wait) != nil {
			r.giveBack(batch)
			return
		}
	}
}

// commit hands entries, prepared on a view of the store read after the
// partition's foreign mark was seen, to the committer and waits until they
// are in the changelog and SQLite. Workers ack only after this returns nil.
func (r *Runner) commit(partition int, seen uint64, entries []store.Entry) error {
	if len(entries) == 0 {
		return nil
	}
	req := &commitReq{partition: partition, seen: seen, entries: entries, done: make(chan error, 1)}
	r.committers[r.Stores.FileOf(partition)].commits <- req
	return <-req.done
}

// committed counts what a commit stored and wakes the queries waiting on it.
// Inputs count as this instance's (ctxpipe_inputs_total) when it applied
// them; the changes of other writers' records count apart.
func (r *Runner) committed(entries []store.Entry, results []store.Result, own bool) {
	ids, outs := make([]string, len(entries)), make([]outcome, len(entries))
	for i, e := range entries {
		ids[i] = e.Input.ID
		outs[i] = outcome{conv: e.Input.ConversationID, status: e.Input.Status, reason: e.Input.Reason, known: !results[i].Duplicate}
		if sent := rejectedAs(e); sent != "" && !results[i].Duplicate {
			// A reused id is rejected under an id of its own; the agent
			// waits on the one it sent (in its own conversation only).
			ids = append(ids, sent)
			outs = append(outs, outs[i])
		}
		if !own {
			if !results[i].Duplicate {
				r.Metrics.Inc("ctxpipe_changelog_changes_total", "")
			}
			continue
		}
		switch {
		case results[i].Duplicate:
			r.Metrics.Inc("ctxpipe_inputs_total", `outcome="duplicate"`)
			continue
		case e.Input.Status == store.StatusRejected:
			r.Metrics.Inc("ctxpipe_inputs_total", `outcome="rejected"`)
		default:
			r.Metrics.Inc("ctxpipe_inputs_total", `outcome="applied"`)
		}
		if e.Changes != nil {
			for _, ev := range e.Changes.Events {
				r.Metrics.Inc("ctxpipe_events_total", fmt.Sprintf(`type=%q`, ev.Header().Type))
			}
		}
	}
	r.waiters.done(ids, outs)
}

// rejectedAs is the id an input was sent under when it is stored under
// another (a duplicate_id rejection), or "".
func rejectedAs(e store.Entry) string {
	if e.Input.Status != store.StatusRejected || e.Changes == nil || len(e.Changes.Events) == 0 {
		return ""
	}
	if ev, ok := e.Changes.Events[0].(*schema.InputRejected); ok && ev.InputID != e.Input.ID {
		return ev.InputID
	}
	return ""
}

// poison records an input that kept failing as rejected, so it never blocks
// its conversation again, and acks it. When even that cannot be committed
// the store (or the changelog) is failing, not the input: poison returns
// false and the caller keeps the input and goes on retrying it. Giving it
// back to JetStream instead would let its conversation's later inputs,
// already queued here, overtake it.
func (r *Runner) poison(j *job, cause error) bool {
	e := r.prep.rejection(j, "", schema.Errorf(schema.ReasonPoison, "gave up after the retry budget: %v", cause))
	// A rejection reads nothing of the conversation: any view will do.
	if err := r.commit(j.partition, r.logOf(j.partition).foreignMark(j.partition), []store.Entry{e}); err != nil {
		r.Log.Error("cannot record a poison input; keeping it and retrying", "seq", j.seq, "err", err)
		return false
	}
	r.ack([]*job{j})
	return true
}

// stages records where each input of a committed batch spent its time, from
// the moment CTX_IN stored it (the server's clock) to its commit: delivery
// to this instance, waiting for a worker (its conversation's earlier inputs,
// or a free lane), the engine (prepare), and the commit round. An agent's
// publish → readable is about their sum plus its publish and its read.
func (r *Runner) stages(batch []*job, taken, prepared, committing, committed time.Time) {
	for _, j := range batch {
		if !j.stored.IsZero() {
			r.Metrics.Observe("ctxpipe_input_stage_seconds", `stage="delivery"`, max(0, j.fetched.Sub(j.stored)))
		}
		r.Metrics.Observe("ctxpipe_input_stage_seconds", `stage="queued"`, max(0, taken.Sub(j.fetched)))
		// The last attempt's: a retried batch's backoff counts nowhere.
		r.Metrics.Observe("ctxpipe_input_stage_seconds", `stage="prepare"`, committing.Sub(prepared))
		r.Metrics.Observe("ctxpipe_input_stage_seconds", `stage="commit"`, committed.Sub(committing))
	}
}

func (r *Runner) ack(batch []*job) {
	for _, j := range batch {
		if _, ok := j.msg.(replayed); ok {
			r.replays.committed(j.partition, j.seq)
		}
		// Ack, not DoubleAck: a lost ack only causes a redelivery, which the
		// input-id check turns into a no-op, and waiting for the server's
		// confirmation per message would halve throughput.
		if err := j.msg.Ack(); err != nil {
			// Expected after the pin moved: the new owner has it.
			r.Log.Debug("ack failed; the input will be redelivered and skipped", "seq", j.seq, "err", err)
		}
		r.held.release(j)
	}
}

// skipReplayed acks the inputs of batch that a term start read again and
// committed already (replays) and returns the others.
func (r *Runner) skipReplayed(batch []*job) []*job {
	kept := batch[:0]
	for _, j := range batch {
		if _, again := j.msg.(replayed); !again && j.seq != 0 && r.replays.take(j.partition, j.seq) {
			// Counted as any duplicate is, in every stage (prepared and
			// committed in no time).
			now := time.Now()
			r.Metrics.Inc("ctxpipe_inputs_total", `outcome="duplicate"`)
			r.stages([]*job{j}, now, now, now, now)
			r.ack([]*job{j})
			continue
		}
		kept = append(kept, j)
	}
	return kept
}

// giveBack naks inputs that were not applied (shutdown), so another
// instance, or this one after a restart, gets them at once.
func (r *Runner) giveBack(batch []*job) {
	for _, j := range batch {
		if err := j.msg.Nak(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			r.Log.Debug("nak failed", "seq", j.seq, "err", err)
		}
		r.held.release(j)
	}
}

// logOf is the changelog state of partition p's file.
func (r *Runner) logOf(p int) *logState {
	return r.committers[r.Stores.FileOf(p)].log
}

// Held is how many fetched inputs are not yet acked or given back.
func (r *Runner) Held() int { return r.held.count() }

// Ready tells whether the runner is consuming: its consumer exists and it
// heard from it recently. It is what /readyz reports.
func (r *Runner) Ready() (bool, string) {
	now := time.Now()
	if ok, why := r.stored.ready(now, 3*r.cfg.ProbeInterval); !ok {
		return false, why
	}
	return r.health.ready(now, 3*r.cfg.ProbeInterval)
}

// ServeQueries answers ctx.q.history, ctx.q.status and ctx.q.events in the
// queue group over nc, passing each query on to the instance that owns its
// conversation's partition when that is not this one, and answers the
// other instances' conversation lists. The returned func unsubscribes.
func (r *Runner) ServeQueries(ctx context.Context, nc *nats.Conn) (func() error, error) {
	return r.queries.serve(ctx, nc)
}

// History, Status and Events answer a ctx.q.history, ctx.q.status and
// ctx.q.events request body from this instance's files.
func (r *Runner) History(ctx context.Context, data []byte) []byte {
	return r.queries.history(ctx, data)
}

func (r *Runner) Status(ctx context.Context, data []byte) []byte { return r.queries.status(ctx, data) }

func (r *Runner) Events(ctx context.Context, data []byte) []byte { return r.queries.events(ctx, data) }
