package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/changelog"
	"github.com/ctxpipe/ctxpipe/engine"
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

// Runner consumes CTX_IN and applies each input.
type Runner struct {
	cfg Config
	Deps
	waiters *waiters
	health  health
	// stored is the store's health as the committers see it.
	stored storeHealth
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

	heldMu    sync.Mutex
	held      map[*job]struct{}
	heldBytes int
	roomFreed *sync.Cond // signalled when held bytes go down
}

// job is one fetched JetStream message on its way through a worker.
type job struct {
	msg       jetstream.Msg
	partition int
	subject   string // as published: the partition token taken out
	conv      string // the subject's conversation token, "" when unreadable
	seq       uint64 // stream sequence: the id of last resort
	deliver   uint64 // delivery count
	touched   time.Time
	stored    time.Time // when CTX_IN stored it (the server's clock), and
	fetched   time.Time // when it came here: for the latency stages

	hashed bool
	hash   [32]byte // of the payload, once computed (payloadHash)
}

// payloadHash is the sha256 of the payload, computed once: the duplicate
// check, the changelog record and the store all need it, and for a 4 MiB
// turn it is not free.
func (j *job) payloadHash() [32]byte {
	if !j.hashed {
		j.hash, j.hashed = store.PayloadHash(j.msg.Data()), true
	}
	return j.hash
}

// tenant is the tenant the input came from, as its subject names it: the
// scope of its id (store.InputRecord.Tenant reads the same).
func (j *job) tenant() string { return schema.SubjectTenant(j.subject) }

// inputKey identifies an input: its id is unique within its tenant only.
type inputKey struct{ tenant, id string }

// storedPayload is the job's payload as an input row keeps it, with the
// whole payload's hash and size.
func (j *job) storedPayload(status store.Status) ([]byte, *store.StoredPayload) {
	data := j.msg.Data()
	sp := &store.StoredPayload{Hash: j.payloadHash(), Size: len(data)}
	if status == store.StatusRejected && len(data) > store.RejectedPayloadPrefix {
		data = data[:store.RejectedPayloadPrefix]
	}
	return data, sp
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
	r := &Runner{cfg: cfg, Deps: d, waiters: newWaiters(), held: map[*job]struct{}{}, clog: &changelog.Log{JS: d.JS, MaxPiece: cfg.MaxLogPiece}}
	r.roomFreed = sync.NewCond(&r.heldMu)
	r.own = &ownership{name: cfg.Name, standby: cfg.Standby, rebalanceEvery: cfg.RebalanceEvery, catchUpTimeout: cfg.CatchUpTimeout,
		members: d.Members, logger: d.Log, metrics: d.Metrics,
		heldChanged: func() {
			for _, f := range r.followers {
				f.follow()
			}
		},
		pullChanged: func() { r.queries.syncOwned() }}
	r.queries = &queryServer{stores: d.Stores, profiles: d.Profiles, engine: d.Engine, waiters: r.waiters, parts: r.own, js: d.JS,
		name: cfg.Name, maxReads: cfg.MaxQueryReads, maxWaits: cfg.MaxQueryWaits, logger: d.Log, metrics: d.Metrics}
	r.Metrics.Help("ctxpipe_inputs_total", "Inputs by outcome (applied, rejected, duplicate).")
	r.Metrics.Help("ctxpipe_events_total", "Events committed to the outbox, by type.")
	r.Metrics.Help("ctxpipe_retries_total", "Worker retries of transient failures.")
	r.Metrics.Help("ctxpipe_commits_total", "SQLite transactions committed.")
	r.Metrics.Help("ctxpipe_consumer_rebuilds_total", "Times the runner rebuilt a partition's consumer after a fetch failure.")
	r.Metrics.Help("ctxpipe_changelog_lost_total", "Appends refused because records this store applied are gone from CTX_STATE (purged or recreated): nothing commits until it is restored, and /readyz says so.")
	r.Metrics.Help("ctxpipe_changelog_fenced_total", "Batches prepared again because another writer appended to the partition first (the append was refused, or its record was applied while they were prepared).")
	r.Metrics.Help("ctxpipe_changelog_applied_total", "Changelog records of other writers (or of this instance before a crash) applied to this instance's SQLite.")
	r.Metrics.Help("ctxpipe_changelog_changes_total", "Inputs' changes applied from those records (not counted in ctxpipe_inputs_total).")
	r.Metrics.Help("ctxpipe_changelog_unreadable_total", "Changelog messages or records skipped because they could not be read or applied.")
	r.Metrics.Help("ctxpipe_input_stage_seconds", "Where committed inputs spent their time, summed per input: delivery (stored in CTX_IN, by the server's clock, to fetched here), queued (fetched to taken by a worker), prepare (the eng), commit (the commit round, fsync included).")
	r.Metrics.Help("ctxpipe_commit_file_seconds", "Time each file's committer spent on its commit rounds (the SQL, the wait for the appends, the commit): the serial part of that file's commits.")
	r.Metrics.Help("ctxpipe_partition_terms_total", "Partitions this instance took (a new pin: catch up, replay the unacked inputs).")
	r.Metrics.Help("ctxpipe_partitions_adopted_total", "Partitions whose unacked inputs this instance applied because their owner went silent while nobody held the pin (no new input to start a term).")
	r.Metrics.Gauge("ctxpipe_partitions_owned", "Partitions this instance received inputs for, under its pin, in the last 30 s.", func(context.Context) (float64, error) {
		return float64(r.own.owned()), nil
	})
	r.Metrics.Gauge("ctxpipe_changelog_cursor", "CTX_STATE sequence up to which this instance has applied the changelog of the partitions it holds.", func(context.Context) (float64, error) {
		return float64(r.Cursor()), nil
	})
	r.Metrics.Gauge("ctxpipe_partitions_pulling", "Partitions whose inputs this instance pulls now: those it is preferred for among the live instances, restored.", func(context.Context) (float64, error) {
		if r.nParts.Load() == 0 {
			return 0, nil
		}
		return float64(len(r.own.pullStarts())), nil
	})
	r.Metrics.Help("ctxpipe_partitions_restored_total", "Partitions this instance gained (as owner or standby) and restored from the changelog.")
	r.Metrics.Help("ctxpipe_partition_restore_seconds", "From gaining a partition to holding its changelog up to its last record then.")
	r.Metrics.Gauge("ctxpipe_partitions_held", "Partitions whose state this instance keeps (owner or standby) and has restored.", func(context.Context) (float64, error) {
		if r.nParts.Load() == 0 {
			return 0, nil
		}
		_, n := r.own.holds.counts()
		return float64(n), nil
	})
	r.Metrics.Gauge("ctxpipe_changelog_behind", "Partitions held whose last changelog record this instance has not applied yet (one request per partition held, at each scrape).", func(ctx context.Context) (float64, error) {
		n, err := r.Behind(ctx)
		return float64(n), err
	})
	r.Metrics.Gauge("ctxpipe_last_fetch_age_seconds", "Seconds since the runner last heard from its consumer (a message or a successful consumer check); -1 before the first.", func(context.Context) (float64, error) {
		age, ok := r.health.fetchAge(time.Now())
		if !ok {
			return -1, nil
		}
		return age.Seconds(), nil
	})
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
			c.run(r.followers[i].out)
		}()
	}
	hbDone := make(chan struct{})
	go r.heartbeat(hbDone)

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

// Ready tells whether the runner is consuming: its consumer exists and it
// heard from it recently. It is what /readyz reports.
func (r *Runner) Ready() (bool, string) {
	now := time.Now()
	if ok, why := r.stored.ready(now, 3*r.cfg.ProbeInterval); !ok {
		return false, why
	}
	return r.health.ready(now, 3*r.cfg.ProbeInterval)
}

// hold registers a fetched input. The scheduler never blocks the
// dispatcher, so this is where memory is bounded: past MaxHeldBytes the
// dispatcher waits for the workers to ack (one input is always let through,
// however large).
func (r *Runner) hold(j *job) {
	n := len(j.msg.Data())
	r.heldMu.Lock()
	for r.heldBytes > 0 && r.heldBytes+n > r.cfg.MaxHeldBytes {
		r.roomFreed.Wait()
	}
	r.held[j] = struct{}{}
	r.heldBytes += n
	r.heldMu.Unlock()
}

func (r *Runner) release(j *job) {
	r.heldMu.Lock()
	if _, ok := r.held[j]; ok {
		delete(r.held, j)
		r.heldBytes -= len(j.msg.Data())
		r.roomFreed.Broadcast()
	}
	r.heldMu.Unlock()
}

// Held is how many fetched inputs are not yet acked or given back.
func (r *Runner) Held() int {
	r.heldMu.Lock()
	defer r.heldMu.Unlock()
	return len(r.held)
}

// heartbeat sends in-progress acks for every input held longer than a third
// of the ack wait: queued behind a slow condense or being condensed, an
// input must not be redelivered.
func (r *Runner) heartbeat(done <-chan struct{}) {
	every := r.cfg.AckWait / 3
	t := time.NewTicker(every / 2)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case now := <-t.C:
			r.heldMu.Lock()
			var due []*job
			for j := range r.held {
				if now.Sub(j.touched) >= every {
					j.touched = now
					due = append(due, j)
				}
			}
			r.heldMu.Unlock()
			for _, j := range due {
				if err := j.msg.InProgress(); err != nil {
					r.Log.Debug("in-progress ack failed", "seq", j.seq, "err", err)
				}
			}
		}
	}
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
		} else {
			r.handle(ctx, batch)
		}
		r.sched.release(conv)
	}
}

// handle applies and commits a conversation's batch, retrying transient failures with
// backoff within the retry budget. A batch that keeps failing is split so
// that one bad input cannot hold back the others; a single input that keeps
// failing is rejected as poison.
func (r *Runner) handle(ctx context.Context, batch []*job) {
	start, backoff := time.Now(), 50*time.Millisecond
	behind := 0
	for {
		p := batch[0].partition
		seen := r.logOf(p).foreignMark(p)
		t0 := time.Now()
		entries, err := r.prepare(ctx, batch)
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
		if errors.Is(err, errBehind) {
			// Not the inputs' doing: a record of the partition is in the
			// changelog and not yet in this store. Prepared again once the
			// follower has applied it (or after behindWait, if it has not);
			// neither split nor poisoned, however long that takes.
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
		r.Log.Warn("transient failure; retrying", "inputs", len(batch), "err", err, "backoff", backoff)
		if len(batch) > 1 {
			for i, j := range batch {
				if ctx.Err() != nil {
					// Not one of them may go on after another was given back.
					r.giveBack(batch[i:])
					return
				}
				r.handle(ctx, []*job{j})
			}
			return
		}
		if time.Since(start) > r.cfg.RetryBudget && !errors.Is(err, errStoreDown) && r.poison(batch[0], err) {
			return
		}
		select {
		case <-ctx.Done():
			r.giveBack(batch)
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// behindWait bounds a fenced batch's wait for the follower: past it the
// batch is prepared again anyway (the fence then tells whether the wait is
// over).
const behindWait = time.Second

// poison records an input that kept failing as rejected, so it never blocks
// its conversation again, and acks it. When even that cannot be committed
// the store (or the changelog) is failing, not the input: poison returns
// false and the caller keeps the input and goes on retrying it. Giving it
// back to JetStream instead would let its conversation's later inputs,
// already queued here, overtake it.
func (r *Runner) poison(j *job, cause error) bool {
	e := r.rejection(j, "", schema.Errorf(schema.ReasonPoison, "gave up after the retry budget: %v", cause))
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
		// Ack, not DoubleAck: a lost ack only causes a redelivery, which the
		// input-id check turns into a no-op, and waiting for the server's
		// confirmation per message would halve throughput.
		if err := j.msg.Ack(); err != nil {
			// Expected after the pin moved: the new owner has it.
			r.Log.Debug("ack failed; the input will be redelivered and skipped", "seq", j.seq, "err", err)
		}
		r.release(j)
	}
}

// giveBack naks inputs that were not applied (shutdown), so another
// instance, or this one after a restart, gets them at once.
func (r *Runner) giveBack(batch []*job) {
	for _, j := range batch {
		if err := j.msg.Nak(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			r.Log.Debug("nak failed", "seq", j.seq, "err", err)
		}
		r.release(j)
	}
}

// preEncodeMax is the largest input a worker encodes for the committer
// (prepare).
const preEncodeMax = 256 << 10

// prepare runs the engine over a conversation's batch. Each conversation's state and
// history are read from the store once and then carried forward in memory,
// so the inputs of one batch see each other's effects before they commit.
// Duplicates are found for the whole batch in one query.
func (r *Runner) prepare(ctx context.Context, batch []*job) ([]store.Entry, error) {
	type item struct {
		in  schema.Input
		rej *store.Entry
	}
	items := make([]item, len(batch))
	// Input ids are unique per tenant. A batch is one conversation's, so
	// one tenant's; grouped anyway, so that no id is ever looked up in
	// another tenant's.
	ids := map[string][]string{}
	for i, j := range batch {
		in, rej := r.decode(j)
		items[i] = item{in, rej}
		if rej == nil {
			tenant := j.tenant()
			ids[tenant] = append(ids[tenant], in.ID)
		}
	}
	// A batch is one conversation's, so one partition's: one file.
	st := r.storeOf(batch[0].partition)
	stored := map[inputKey]store.SeenInput{}
	for tenant, group := range ids {
		seen, err := st.SeenInputs(ctx, tenant, group)
		if err != nil {
			return nil, err
		}
		for id, si := range seen {
			stored[inputKey{tenant, id}] = si
		}
	}
	views := map[string]*convView{}
	seen := map[inputKey]bool{}
	// taken holds this batch's applied inputs, as the store will hold them.
	taken := map[inputKey]store.SeenInput{}
	entries := make([]store.Entry, 0, len(batch))
	for i, j := range batch {
		var e *store.Entry
		it := items[i]
		if it.rej != nil {
			e = r.once(it.rej, seen)
			if e != nil {
				entries = append(entries, *e)
			}
			continue
		}
		key := inputKey{j.tenant(), it.in.ID}
		prev, dup := taken[key]
		if !dup {
			prev, dup = stored[key]
		}
		switch {
		case dup && sameInput(prev, it.in.ConversationID, j.payloadHash()):
			// A redelivery, or the client sent it again: already done.
			r.Metrics.Inc("ctxpipe_inputs_total", `outcome="duplicate"`)
			continue
		case dup:
			e = r.reusedID(j, it.in, prev, seen)
		default:
			var err error
			if e, err = r.apply(ctx, st, j, it.in, views, seen); err != nil {
				return nil, err
			}
			taken[key] = store.SeenInput{ConversationID: it.in.ConversationID, PayloadHash: j.payloadHash()}
		}
		if e != nil {
			entries = append(entries, *e)
		}
	}
	// Encode here, on the worker, what the committer would otherwise encode
	// on its one goroutine, twice (for SQLite and for the changelog record).
	// An entry that cannot be encoded is left unencoded: the commit refuses
	// its batch, commits the other requests alone, and the worker's
	// retries end in a poison rejection.
	for i := range entries {
		// Not a huge turn: its encoding would be held, beside its payload
		// and its decoded content, for as long as the batch waits for the
		// committer (4 MiB turns raised the service's peak RSS by a
		// third); the committer encodes it when it gets there.
		if e := &entries[i]; e.Changes != nil && e.Encoded == nil && len(e.Input.Payload) <= preEncodeMax {
			if enc, err := store.EncodeChanges(*e); err == nil {
				e.Encoded = enc
			}
		}
	}
	return entries, nil
}

// sameInput tells whether a stored input is this very input again: the same
// conversation and the same bytes.
func sameInput(prev store.SeenInput, conv string, hash [32]byte) bool {
	return prev.ConversationID == conv && prev.PayloadHash == hash
}

// reusedID rejects an input whose id was used before with other content or
// in another conversation (duplicate_id). The rejection is recorded under an
// id derived from the input id, the conversation and the content, so it is
// idempotent itself and never collides with the input that owns the id.
func (r *Runner) reusedID(j *job, in schema.Input, prev store.SeenInput, seen map[inputKey]bool) *store.Entry {
	h := j.payloadHash()
	where := "with other content"
	if prev.ConversationID != in.ConversationID {
		where = "in another conversation"
	}
	e := r.rejection(j, in.ID, schema.Errorf(schema.ReasonDuplicateID, "input id %s was used before %s", in.ID, where))
	e.Input.ID = engine.DeriveID(fmt.Sprintf("%s/%s/%x", in.ID, in.ConversationID, h[:8]), "input/duplicate_id")
	e.Input.ConversationID, e.Input.TS = in.ConversationID, in.TS
	ev := e.Changes.Events[0].(*schema.InputRejected)
	ev.ID = engine.DeriveID(e.Input.ID, "event/input_rejected")
	return r.once(&e, seen)
}

// decode checks an input's size and delivery count and decodes it; a bad
// input comes back as its rejection entry.
func (r *Runner) decode(j *job) (schema.Input, *store.Entry) {
	data, subject := j.msg.Data(), j.subject
	var cause error
	switch {
	case len(data) > r.cfg.MaxInputBytes:
		cause = schema.Errorf(schema.ReasonTooLarge, "%d bytes is over the %d-byte limit", len(data), r.cfg.MaxInputBytes)
	case j.deliver >= uint64(r.cfg.MaxDeliver):
		cause = schema.Errorf(schema.ReasonPoison, "delivered %d times without being applied", j.deliver)
	default:
		in, err := schema.DecodeInput(subject, data)
		if err == nil {
			return in, nil
		}
		cause = err
	}
	e := r.rejection(j, schema.PeekID(data), cause)
	return schema.Input{}, &e
}

// apply runs the engine for one decoded input.
func (r *Runner) apply(ctx context.Context, s *store.Store, j *job, in schema.Input, views map[string]*convView, seen map[inputKey]bool) (*store.Entry, error) {
	v := views[in.ConversationID]
	if v == nil {
		st, _, err := s.State(ctx, in.ConversationID)
		if err != nil {
			return nil, fmt.Errorf("load state of %s: %w", in.ConversationID, err)
		}
		v = &convView{s: s, conv: in.ConversationID, state: st}
		views[in.ConversationID] = v
	}
	pid := v.state.ProfileID
	if in.Turn != nil && in.Turn.ProfileID != "" {
		pid = in.Turn.ProfileID
	}
	if pid == "" {
		pid = schema.DefaultProfileID
	}
	reject := func(err error) (*store.Entry, error) {
		e := r.rejection(j, in.ID, err)
		e.Input.ConversationID, e.Input.TS = in.ConversationID, in.TS
		return r.once(&e, seen), nil
	}
	p, ok, err := r.Profiles.Lookup(ctx, pid)
	if err != nil {
		// The bucket cannot be read now: retried, then poison past the
		// retry budget; never rejected for a profile the watch missed.
		return nil, err
	}
	if !ok {
		return reject(schema.Errorf(schema.ReasonUnknownProfile, "no profile %q", pid))
	}
	t0 := time.Now()
	ch, err := r.Engine.Apply(ctx, v.state, v, &p, in)
	r.Metrics.Observe("ctxpipe_apply_seconds", fmt.Sprintf(`kind=%q`, in.Kind), time.Since(t0))
	if err != nil {
		if schema.ReasonOf(err) == "" {
			return nil, err
		}
		return reject(err)
	}
	v.state = ch.State
	v.pending = append(v.pending, ch)
	seen[inputKey{j.tenant(), in.ID}] = true
	payload, stored := j.storedPayload(store.StatusApplied)
	return &store.Entry{
		Input: store.InputRecord{
			ID: in.ID, ConversationID: in.ConversationID, Kind: string(in.Kind), Subject: j.subject,
			TS: in.TS, Payload: payload, Stored: stored, Status: store.StatusApplied,
		},
		Changes: ch,
	}, nil
}

// once drops a second copy of the same rejected input in one batch.
func (r *Runner) once(e *store.Entry, seen map[inputKey]bool) *store.Entry {
	key := inputKey{e.Input.Tenant(), e.Input.ID}
	if seen[key] {
		return nil
	}
	seen[key] = true
	return e
}

// rejection records an input that will not be applied, with its payload and
// an input_rejected event. id is the input's own id when readable; otherwise
// one is derived from the stream sequence, which a redelivery keeps, so the
// rejection is idempotent too.
func (r *Runner) rejection(j *job, id string, cause error) store.Entry {
	if !validUUID(id) {
		id = engine.DeriveID(fmt.Sprintf("%s/seq/%d", bus.StreamIn, j.seq), "input")
	}
	id = schema.CanonicalID(id)
	reason := schema.ReasonOf(cause)
	msg := cause.Error()
	var se *schema.Error
	if errors.As(cause, &se) {
		msg = se.Message
	}
	// Messages quote what the input held: a 2 MB field would make an event
	// too large to publish (and log).
	msg = schema.Clip(msg, schema.MaxMessageBytes)
	conv := j.conv
	if !schema.ValidConversationKey(conv) {
		conv = schema.ConversationKey(schema.SubjectTenant(j.subject), schema.InvalidConversationID)
	}
	subject := j.subject
	kind := subject[strings.LastIndexByte(subject, '.')+1:]
	ts := time.Now().UnixMilli()
	r.Log.Info("input rejected", "conv", conv, "input_id", id, "reason", reason, "detail", msg)
	payload, stored := j.storedPayload(store.StatusRejected)
	return store.Entry{
		Input: store.InputRecord{
			ID: id, ConversationID: j.conv, Kind: kind, Subject: subject, TS: ts,
			Payload: payload, Stored: stored, Status: store.StatusRejected, Reason: string(reason),
		},
		Changes: &schema.Changes{Events: []schema.Event{&schema.InputRejected{
			EventHeader: schema.EventHeader{
				ID: engine.DeriveID(engine.Scope(j.tenant(), id), "event/input_rejected"), Type: schema.EventInputRejected,
				ConversationID: conv, TS: ts, InputID: id,
			},
			Reason: reason, Message: msg, Subject: subject,
		}}},
	}
}

func validUUID(s string) bool {
	_, err := uuid.Parse(s)
	return err == nil && len(s) == 36
}

// convView is a conversation as the store has it plus this batch's
// uncommitted changes; it serves the engine as its History.
type convView struct {
	s       *store.Store
	conv    string
	state   schema.ConversationState
	pending []*schema.Changes
}

func (v *convView) Messages(ctx context.Context) ([]schema.Message, error) {
	msgs, err := v.s.Messages(ctx, v.conv)
	if err != nil {
		return nil, err
	}
	for _, ch := range v.pending {
		msgs = engine.Apply(msgs, ch)
	}
	return msgs, nil
}

func (v *convView) ContextEvents(ctx context.Context) ([]schema.ContextEventRef, error) {
	refs, err := v.s.ContextEvents(ctx, v.conv)
	if err != nil {
		return nil, err
	}
	for _, ch := range v.pending {
		refs = append(refs, engine.ContextEventRefs(ch.Events)...)
	}
	return refs, nil
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

// Cursor is how far this instance has read the changelog (0 before Run):
// the least of its files' cursors.
func (r *Runner) Cursor() uint64 {
	if r.nParts.Load() == 0 {
		return 0
	}
	var cur uint64
	for i, c := range r.committers {
		if at := c.log.safeCursor(); i == 0 || at < cur {
			cur = at
		}
	}
	return cur
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

// logOf is the changelog state of partition p's file.
func (r *Runner) logOf(p int) *logState {
	return r.committers[r.Stores.FileOf(p)].log
}

// storeOf is partition p's file.
func (r *Runner) storeOf(p int) *store.Store {
	return r.Stores.ForPartition(p)
}
