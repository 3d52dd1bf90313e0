package pipeline

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/changelog"
	"github.com/ctxpipe/ctxpipe/store"
)

// commitReq is one worker's batch (one conversation, so one partition)
// waiting to be committed.
type commitReq struct {
	partition int
	// seen is the partition's foreign mark when the worker began reading
	// the store for these entries (logState.foreignMark).
	seen    uint64
	entries []store.Entry
	done    chan error
}

// size is the payload bytes a request commits, the bulk of its records.
func (q *commitReq) size() int {
	n := 0
	for _, e := range q.entries {
		n += len(e.Input.Payload)
		if e.Input.Stored != nil {
			n = n - len(e.Input.Payload) + e.Input.Stored.Size
		}
	}
	return n
}

// errBehind fails a batch whose partition's changelog moved on under it
// (another writer appended first). It is transient: once the follower has
// applied what was appended, the batch is prepared again.
var errBehind = errors.New("the partition's changelog moved on; catching up")

// commit hands entries, prepared on a view of the store read after the
// partition's foreign mark was seen, to the committer and waits until they
// are in the changelog and SQLite. Workers ack only after this returns nil.
func (r *Runner) commit(partition int, seen uint64, entries []store.Entry) error {
	if len(entries) == 0 {
		return nil
	}
	req := &commitReq{partition: partition, seen: seen, entries: entries, done: make(chan error, 1)}
	r.commits <- req
	return <-req.done
}

// logState is the committer's view of the changelog, owned by its
// goroutine; applied is shared so that the follower skips, without decoding
// them, the records this instance wrote itself.
type logState struct {
	applied   []uint64 // per partition: last CTX_STATE sequence the store reflects
	pieceTail []uint64 // per partition: last piece of an unfinished record after applied
	// pieceHead is, per partition, the first piece of a record not yet
	// complete: the cursor a follower restarts from must not pass it, or
	// the record could never be put together.
	pieceHead []uint64
	cursor    uint64 // every message up to it was handled

	mu     sync.RWMutex
	shared []uint64 // copy of applied for the follower
	// foreign is, per partition, the sequence of the last record of another
	// writer (or of this one, brought in by the follower after its own
	// commit failed) that the store applied. A worker's view of a
	// conversation is stale if it moved while the worker prepared: the
	// fence alone does not tell, since the store has applied that record
	// and the fence moved with it.
	foreign []uint64
	// own holds, per partition, the last record this instance appended
	// and is committing: the follower must not fetch it back meanwhile.
	// inflight marks the partitions this instance is appending to, whose
	// new sequence it does not know yet: the follower may see the message
	// before the append returns. A message of another writer skipped
	// meanwhile is read again, as when an own commit fails (see
	// applyFollowed): this instance's append was then fenced.
	own      []uint64
	inflight []bool
	cur   uint64
	moved chan struct{} // closed and replaced whenever cursor moves
}

func newLogState(partitions int, pos map[int]uint64, cursor uint64) *logState {
	ls := &logState{applied: make([]uint64, partitions+1), pieceTail: make([]uint64, partitions+1), pieceHead: make([]uint64, partitions+1),
		shared: make([]uint64, partitions+1), own: make([]uint64, partitions+1), inflight: make([]bool, partitions+1),
		foreign: make([]uint64, partitions+1),
		cursor: cursor, cur: cursor, moved: make(chan struct{})}
	for p, seq := range pos {
		if p >= 0 && p <= partitions {
			ls.applied[p], ls.shared[p] = seq, seq
		}
	}
	return ls
}

// foreignMark is partition p's foreign mark (see logState.foreign). A
// worker reads it before it reads the store for a batch.
func (ls *logState) foreignMark(p int) uint64 {
	ls.mu.RLock()
	defer ls.mu.RUnlock()
	return ls.foreign[p]
}

func (ls *logState) setForeign(p int, seq uint64) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.foreign[p] = max(ls.foreign[p], seq)
}

// fence is the sequence an append to partition p must find last: what the
// store reflects, or the end of an unfinished record's pieces right after
// it (a writer that died between pieces).
func (ls *logState) fence(p int) uint64 { return max(ls.applied[p], ls.pieceTail[p]) }

func (ls *logState) setApplied(p int, seq uint64) {
	if seq <= ls.applied[p] {
		return
	}
	ls.applied[p] = seq
	ls.mu.Lock()
	ls.shared[p] = seq
	ls.mu.Unlock()
}

func (ls *logState) setCursor(seq uint64) {
	for _, head := range ls.pieceHead {
		if head > 0 {
			seq = min(seq, head-1)
		}
	}
	if seq <= ls.cursor {
		return
	}
	ls.cursor = seq
	ls.mu.Lock()
	ls.cur = seq
	close(ls.moved)
	ls.moved = make(chan struct{})
	ls.mu.Unlock()
}

// safeCursor is where a follower may restart: the cursor, or before the
// first piece of a record still incomplete.
func (ls *logState) safeCursor() uint64 {
	ls.mu.RLock()
	defer ls.mu.RUnlock()
	return ls.cur
}

// has tells the follower whether the store holds p's message seq already,
// or is about to (this instance appended it and is committing it).
func (ls *logState) has(p int, seq uint64) bool {
	ls.mu.RLock()
	defer ls.mu.RUnlock()
	return p >= 0 && p < len(ls.shared) && (seq <= ls.shared[p] || seq <= ls.own[p] || ls.inflight[p])
}

// appending marks an append to partition p in flight; appended ends it
// with the sequence the append reached (0: it failed). The record is then
// this instance's own while its commit runs; appendDone ends that (the
// commit either landed, and applied covers it, or failed, and the follower
// must read it after all).
func (ls *logState) appending(p int) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.inflight[p] = true
}

func (ls *logState) appended(p int, seq uint64) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.own[p] = max(ls.own[p], seq)
	ls.inflight[p] = false
}

func (ls *logState) appendDone(parts map[int]*partitionBatch) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for p := range parts {
		ls.own[p] = 0
	}
}

// waitCursor waits until every changelog message up to seq was handled.
func (ls *logState) waitCursor(ctx context.Context, seq uint64) error {
	for {
		ls.mu.RLock()
		cur, moved := ls.cur, ls.moved
		ls.mu.RUnlock()
		if cur >= seq {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-moved:
		}
	}
}

// Cursor is how far this instance has read the changelog (0 before Run).
func (r *Runner) Cursor() uint64 {
	if r.nParts.Load() == 0 {
		return 0
	}
	r.log.mu.RLock()
	defer r.log.mu.RUnlock()
	return r.log.cur
}

// committer is the only writer of the store. It takes the workers' batches
// (appending them to the changelog before committing them) and the
// follower's records (other writers' appends), one transaction at a time:
// with synchronous=FULL each transaction costs an fsync, so grouping many
// inputs into one is what makes durable acks cheap.
func (r *Runner) committer(followed <-chan changelog.Item) {
	commits := r.commits
	for commits != nil || followed != nil {
		select {
		case req, ok := <-commits:
			if !ok {
				commits = nil
				continue
			}
			reqs, n, size := []*commitReq{req}, len(req.entries), req.size()
		gather:
			// Bounded in inputs and in bytes: the round's changelog
			// records are encoded in memory, and 4 MiB turns would make
			// a round of a thousand inputs gigabytes.
			for n < r.cfg.MaxBatch && size < r.cfg.MaxCommitBytes {
				select {
				case x, ok := <-commits:
					if !ok {
						commits = nil
						break gather
					}
					reqs = append(reqs, x)
					n += len(x.entries)
					size += x.size()
				default:
					break gather
				}
			}
			r.commitLocal(reqs)
		case item, ok := <-followed:
			if !ok {
				followed = nil
				continue
			}
			items := []changelog.Item{item}
		more:
			for len(items) < 512 {
				select {
				case x, ok := <-followed:
					if !ok {
						followed = nil
						break more
					}
					items = append(items, x)
				default:
					break more
				}
			}
			r.applyFollowed(items)
		}
	}
}

// partitionBatch is the requests of one partition in one commit round.
type partitionBatch struct {
	partition int
	reqs      []*commitReq
	entries   []store.Entry
	refusal   error // why the store refused the batch, if it did
}

// commitLocal appends the workers' batches to the changelog, one record per
// partition, and commits them to SQLite.
//
// The append and the SQL run at once: the records are appended while the
// transaction applies the same entries, and it commits once both are done.
// A record holds every entry of its batch, including any the store then
// finds to be a duplicate: a replay finds it to be one too, since the
// original is earlier in the log. When the log refuses a record (ErrFenced)
// its batch is rolled back. When the store refuses a batch whose record is
// in the log, the record is skipped as every follower and a rebuild skip
// it, and the batch's requests are committed again, each alone.
func (r *Runner) commitLocal(reqs []*commitReq) {
	var batches []*partitionBatch
	byPart := map[int]*partitionBatch{}
	for _, q := range reqs {
		if q.seen != r.log.foreignMark(q.partition) {
			// Prepared on a view older than a record the follower applied
			// since (a takeover's catch-up): prepare again.
			r.Metrics.Inc("ctxpipe_changelog_fenced_total", "")
			q.done <- fmt.Errorf("commit %d inputs: %w", len(q.entries), errBehind)
			continue
		}
		b := byPart[q.partition]
		if b == nil {
			b = &partitionBatch{partition: q.partition}
			byPart[q.partition] = b
			batches = append(batches, b)
		}
		b.reqs = append(b.reqs, q)
		b.entries = append(b.entries, q.entries...)
	}
	t0 := time.Now()
	// SQLite statements run under a context that cannot be cancelled:
	// go-sqlite3 watches a cancellable one from a goroutine per statement,
	// which costs more than the statement. The appends are bounded.
	sqlCtx := context.Background()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	at := time.Now().UnixMilli()

	// refused are the batches the store would not take; their requests are
	// committed again, each alone, once this round is over (no transaction
	// open, no append in flight).
	var refused []*partitionBatch
	defer func() {
		for _, b := range refused {
			r.retryAlone(b)
		}
	}()
	records := make([][]byte, 0, len(batches))
	for _, b := range batches {
		data, err := changelog.Encode(changelog.Record{Partition: b.partition, At: at, Entries: b.entries})
		if err != nil {
			// What the record cannot encode, the store refuses: as before.
			b.refusal = err
			refused = append(refused, b)
			continue
		}
		records = append(records, data)
		batches[len(records)-1] = b
	}
	batches = batches[:len(records)]

	seqs := make([]uint64, len(batches))
	errs := make([]error, len(batches))
	var wg sync.WaitGroup
	for i, b := range batches {
		wg.Add(1)
		r.log.appending(b.partition)
		go func(i int, p int, fence uint64) {
			defer wg.Done()
			seqs[i], errs[i] = r.clog.Append(ctx, p, fence, records[i])
			if errs[i] != nil {
				seqs[i] = 0
			}
			r.log.appended(p, seqs[i])
		}(i, b.partition, r.log.fence(b.partition))
	}
	defer r.log.appendDone(byPart)
	applied := map[*partitionBatch]bool{}
	tx, ok, err := r.begin(sqlCtx, at, batches)
	tApply := time.Since(t0)
	wg.Wait()
	tAppend := time.Since(t0)

	// positions are the partitions' new changelog positions: every record
	// appended, applied or skipped.
	positions := map[int]uint64{}
	var logged []*partitionBatch // in the log and applied
	for i, b := range batches {
		if errs[i] == nil {
			positions[b.partition] = seqs[i]
		}
	}
	if err != nil {
		r.failRound(batches, err)
		return
	}
	for _, b := range ok {
		applied[b] = true
	}
	for i, b := range batches {
		switch {
		case errs[i] != nil:
			err := errs[i]
			if errors.Is(err, changelog.ErrFenced) {
				r.Metrics.Inc("ctxpipe_changelog_fenced_total", "")
				err = errBehind
			}
			for _, q := range b.reqs {
				q.done <- fmt.Errorf("commit %d inputs: %w", len(b.entries), err)
			}
		case !applied[b]:
			// In the log, refused here: skipped, as a follower skips it.
			r.Log.Error("a change in the changelog cannot be committed here; skipped, its inputs are committed again",
				"partition", b.partition, "seq", seqs[i], "err", b.refusal)
			r.Metrics.Inc("ctxpipe_changelog_unreadable_total", "")
			refused = append(refused, b)
		default:
			logged = append(logged, b)
		}
	}
	if len(logged) < len(ok) {
		// A batch applied but not in the log: apply again without it.
		tx.Rollback()
		var more []*partitionBatch
		tx, more, err = r.begin(sqlCtx, at, logged)
		if err != nil {
			r.failRound(logged, err)
			return
		}
		for _, b := range logged {
			if !slices.Contains(more, b) {
				r.Log.Error("a change in the changelog cannot be committed here; skipped, its inputs are committed again",
					"partition", b.partition, "err", b.refusal)
				r.Metrics.Inc("ctxpipe_changelog_unreadable_total", "")
				refused = append(refused, b)
			}
		}
		logged = more
	}
	if len(positions) == 0 {
		tx.Rollback()
		return
	}
	if err := tx.Commit(positions, 0); err != nil {
		r.failRound(logged, err)
		return
	}
	for p, seq := range positions {
		r.log.setApplied(p, seq)
	}
	r.Metrics.Inc("ctxpipe_commits_total", "")
	r.Metrics.Observe("ctxpipe_commit_seconds", "", time.Since(t0))
	// The phases add up to the round: the SQL, then the wait for the
	// appends that outlasted it, then the commit.
	r.Metrics.Observe("ctxpipe_commit_phase_seconds", `phase="apply"`, tApply)
	r.Metrics.Observe("ctxpipe_commit_phase_seconds", `phase="append"`, tAppend-tApply)
	r.Metrics.Observe("ctxpipe_commit_phase_seconds", `phase="sync"`, time.Since(t0)-tAppend)
	results := tx.Results()
	for i, b := range logged {
		r.committed(b.entries, results[i], true)
		for _, q := range b.reqs {
			q.done <- nil
		}
	}
	if r.Relay != nil {
		r.Relay.Notify()
	}
}

// failRound fails every request of a round whose SQLite transaction failed
// as a whole (the database locked or failing). Records already in the log
// are the follower's to commit, once the store works again; the workers try
// again meanwhile (their appends are fenced until the follower is done, and
// then find the inputs stored), so an input is still acked only once it is
// in SQLite.
func (r *Runner) failRound(batches []*partitionBatch, err error) {
	r.Log.Error("a commit round failed; the follower will apply what reached the changelog", "err", err)
	r.follower.retry()
	for _, b := range batches {
		for _, q := range b.reqs {
			q.done <- fmt.Errorf("commit %d inputs: %w", len(b.entries), err)
		}
	}
}

// retryAlone commits each request of a batch the store refused alone, so
// that one worker's bad entry does not hold the others back; a request
// alone is answered with the store's refusal (its worker retries it, then
// rejects it as poison).
func (r *Runner) retryAlone(b *partitionBatch) {
	if len(b.reqs) > 1 {
		for _, q := range b.reqs {
			r.commitLocal([]*commitReq{q})
		}
		return
	}
	b.reqs[0].done <- fmt.Errorf("commit %d inputs: %w", len(b.entries), cmp.Or(b.refusal, errRefused))
}

// errRefused fails a batch the store would not apply, for no reason given.
var errRefused = errors.New("the store refused the batch")

// begin opens a transaction holding batches, dropping each batch the store
// refuses (its refusal is kept in the batch). The transaction may hold no
// batch at all. err is a failure of the store as a whole.
func (r *Runner) begin(ctx context.Context, at int64, batches []*partitionBatch) (tx *store.Tx, kept []*partitionBatch, err error) {
	kept = slices.Clone(batches)
	for {
		groups := make([]store.Group, len(kept))
		for i, b := range kept {
			groups[i] = store.Group{At: at, Entries: b.entries}
		}
		tx, err := r.Store.Begin(ctx, groups)
		if err == nil {
			return tx, kept, nil
		}
		var ge *store.GroupError
		if !errors.As(err, &ge) {
			return nil, nil, err
		}
		kept[ge.Group].refusal = ge.Err
		kept = slices.Delete(kept, ge.Group, ge.Group+1)
	}
}

// committed counts what a commit stored and wakes the queries waiting on it.
// Inputs count as this instance's (ctxpipe_inputs_total) when it applied
// them; the changes of other writers' records count apart.
func (r *Runner) committed(entries []store.Entry, results []store.Result, own bool) {
	ids := make([]string, len(entries))
	for i, e := range entries {
		ids[i] = e.Input.ID
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
	r.waiters.done(ids)
}

// applyFollowed commits the records other writers appended (and moves the
// cursor past everything else) in one transaction.
func (r *Runner) applyFollowed(items []changelog.Item) {
	type rec struct {
		p   int
		seq uint64
		r   *changelog.Record
	}
	var recs []rec
	positions := map[int]uint64{}
	var cursor uint64
	for _, it := range items {
		if it.Record == nil && !it.Piece && it.Err == nil && it.Seq > r.log.applied[it.Partition] {
			// Skipped as this instance's own append whose commit then
			// failed: read it again, and nothing after it yet.
			r.follower.retry()
			break
		}
		cursor = max(cursor, it.Seq)
		if it.Partition >= 0 && it.Partition < len(r.log.pieceHead) {
			// Anything but a piece ends the partition's run of pieces.
			if !it.Piece {
				r.log.pieceHead[it.Partition] = 0
			}
		}
		switch {
		case it.Err != nil:
			r.Log.Error("changelog message unreadable; skipped", "seq", it.Seq, "partition", it.Partition, "err", it.Err)
			r.Metrics.Inc("ctxpipe_changelog_unreadable_total", "")
		case it.Piece:
			if it.Seq > r.log.applied[it.Partition] {
				r.log.pieceTail[it.Partition] = it.Seq
				if r.log.pieceHead[it.Partition] == 0 {
					r.log.pieceHead[it.Partition] = it.Seq
				}
			}
			continue
		case it.Record != nil && it.Seq > max(r.log.applied[it.Partition], positions[it.Partition]):
			recs = append(recs, rec{it.Partition, it.Seq, it.Record})
			positions[it.Partition] = it.Seq
		}
	}
	old := time.Now().Add(-bus.DuplicateWindow / 2).UnixMilli()
	ctx := context.Background() // not cancellable: see commitLocal
	for {
		groups := make([]store.Group, len(recs))
		for i, x := range recs {
			// The writer's relay published these events long ago; only
			// recent ones are sent again (the stream drops the copies), in
			// case the writer died before its relay got to them.
			groups[i] = store.Group{At: x.r.At, Entries: x.r.Entries, Published: x.r.At < old}
		}
		var tx *store.Tx
		var err error
		if len(groups) > 0 {
			tx, err = r.Store.Begin(ctx, groups)
		}
		var ge *store.GroupError
		if errors.As(err, &ge) {
			// Another instance committed this record from the same state:
			// this store differs from it. Nothing better than to say so.
			r.Log.Error("changelog record cannot be applied here; skipped", "partition", recs[ge.Group].p, "seq", recs[ge.Group].seq, "err", ge.Err)
			r.Metrics.Inc("ctxpipe_changelog_unreadable_total", "")
			recs = append(recs[:ge.Group:ge.Group], recs[ge.Group+1:]...)
			continue
		}
		if err == nil && tx != nil {
			err = tx.Commit(positions, cursor)
		} else if err == nil {
			err = r.Store.SetLogCursor(ctx, cursor)
		}
		if err != nil {
			r.Log.Error("applying the changelog failed; retrying", "err", err)
			r.follower.retry()
			return
		}
		for p, seq := range positions {
			r.log.setApplied(p, seq)
		}
		for _, x := range recs {
			r.log.setForeign(x.p, x.seq)
		}
		r.log.setCursor(cursor)
		if tx != nil {
			res := tx.Results()
			for i, x := range recs {
				r.committed(x.r.Entries, res[i], false)
			}
			r.Metrics.Add("ctxpipe_changelog_applied_total", "", float64(len(recs)))
			if r.Relay != nil {
				r.Relay.Notify()
			}
		}
		return
	}
}
