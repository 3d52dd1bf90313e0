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
	"github.com/ctxpipe/ctxpipe/schema"
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
	r.shardOf(partition).commits <- req
	return <-req.done
}

// Cursor is how far this instance has read the changelog (0 before Run):
// the least of its files' cursors.
func (r *Runner) Cursor() uint64 {
	if r.nParts.Load() == 0 {
		return 0
	}
	var cur uint64
	for i, c := range r.shards {
		if at := c.log.safeCursor(); i == 0 || at < cur {
			cur = at
		}
	}
	return cur
}

// committer is the only writer of its shard's file. It takes the workers' batches
// (appending them to the changelog before committing them) and the
// follower's records (other writers' appends), one transaction at a time:
// with synchronous=FULL each transaction costs an fsync, so grouping many
// inputs into one is what makes durable acks cheap.
//
// Rounds overlap by one step: while a round's transaction commits (the
// fsync), the next round's records are already being appended. The
// follower's records are applied only between rounds, never while a
// launched round is pending: its requests were checked against the
// partitions' foreign marks when it was launched.
func (c *shard) committer(follow <-chan followed) {
	commits := c.commits
	var next *round
	// held are followed items that touch a partition of the pending round:
	// they wait, in order, until it is committed.
	var held []changelog.Item
	for {
		if next != nil {
			items := append(held, c.takeFollowed(&follow, 0)...)
			held = nil
			k := 0
			for k < len(items) && !c.waits(next, items[k]) {
				k++
			}
			if k > 0 && c.applyFollowed(items[:k]) {
				k = len(items) // the follower reads them again
			}
			held = items[k:]
			next = c.finish(next, &commits)
			continue
		}
		if len(held) > 0 {
			c.applyFollowed(held)
			held = nil
			continue
		}
		if commits == nil && follow == nil {
			return
		}
		select {
		case req, ok := <-commits:
			if !ok {
				commits = nil
				continue
			}
			next = c.launch(append([]*commitReq{req}, c.gather(&commits, req)...))
		case it, ok := <-follow:
			if !ok {
				follow = nil
				continue
			}
			var items []changelog.Item
			if c.follower.current(it) {
				items = append(items, it.Item)
			}
			if items = append(items, c.takeFollowed(&follow, 511)...); len(items) > 0 {
				c.applyFollowed(items)
			}
		}
	}
}

// takeFollowed takes the items waiting in *follow, without waiting, at most
// limit of them (0: no limit), dropping those read before the follower's
// last retry. It sets *follow to nil when the channel is closed.
func (c *shard) takeFollowed(follow *<-chan followed, limit int) []changelog.Item {
	var items []changelog.Item
	for *follow != nil && (limit == 0 || len(items) < limit) {
		select {
		case it, ok := <-*follow:
			if !ok {
				*follow = nil
				return items
			}
			if c.follower.current(it) {
				items = append(items, it.Item)
			}
		default:
			return items
		}
	}
	return items
}

// gather takes the requests waiting in *commits, without waiting, up to a
// round's bounds (counting first, already taken, if not nil): in inputs, and
// in bytes, since the round's changelog records are encoded in memory and
// 4 MiB turns would make a round of a thousand inputs gigabytes. It sets
// *commits to nil when the channel is closed.
func (c *shard) gather(commits *chan *commitReq, first *commitReq) []*commitReq {
	r := c.r
	var reqs []*commitReq
	n, size := 0, 0
	if first != nil {
		n, size = len(first.entries), first.size()
	}
	for *commits != nil && n < r.cfg.MaxBatch && size < r.cfg.MaxCommitBytes {
		select {
		case x, ok := <-*commits:
			if !ok {
				*commits = nil
				return reqs
			}
			reqs = append(reqs, x)
			n += len(x.entries)
			size += x.size()
		default:
			return reqs
		}
	}
	return reqs
}

// partitionBatch is the requests of one partition in one commit round.
type partitionBatch struct {
	partition int
	reqs      []*commitReq
	entries   []store.Entry
	refusal   error // why the store refused the batch, if it did
}

// round is one commit round: the workers' batches, one per partition, and
// their changelog records, appending.
type round struct {
	t0      time.Time
	at      int64 // commit time, Unix milliseconds
	batches []*partitionBatch
	seqs    []uint64 // per batch: the sequence its record reached
	errs    []error  // per batch: why its append failed
	appends sync.WaitGroup
	// refused are the batches the store would not take; their requests are
	// committed again, each alone, once the round is over.
	refused []*partitionBatch
	// doomed, when set, fails the whole round: the round before it, whose
	// records precede its own in the log, could not be committed.
	doomed error
	cancel context.CancelFunc
}

// waits tells whether a followed item must wait until the pending round
// next is committed: a record, or a piece of one, of a partition next
// appends to (applied now, it would come before next's own record, which
// precedes it in the log), or a message of such a partition this store does
// not reflect yet (next's own record, skipped as held, or one skipped while
// next appended). What this store already reflects goes through: on a
// single instance that is every round's own record, seen while the next
// round is pending.
func (c *shard) waits(next *round, it changelog.Item) bool {
	if !next.touches(it.Partition) {
		return false
	}
	return it.Record != nil || it.Piece || it.Seq > c.log.applied[it.Partition]
}

// touches tells whether the round appends to partition p.
func (rd *round) touches(p int) bool {
	for _, b := range rd.batches {
		if b.partition == p {
			return true
		}
	}
	return false
}

// commitLocal commits reqs in a round of their own, not overlapping any
// other.
func (c *shard) commitLocal(reqs []*commitReq) {
	if rd := c.launch(reqs); rd != nil {
		c.finish(rd, nil)
	}
}

// launch starts a commit round: it groups the requests by partition, drops
// those prepared on a view older than their partition's foreign mark,
// encodes one record per partition and starts appending them. It returns
// nil when nothing is left to commit.
//
// A record holds every entry of its batch, including one the store will
// find to be a duplicate: a replay finds it to be one too, since the
// original is earlier in the log. The records are appended while the
// transaction applies the same entries (finish); when the log refuses one
// (ErrFenced) its batch is rolled back; when the store refuses a batch
// whose record is in the log, the record is skipped as every follower and a
// rebuild skip it, and the batch's requests are committed again, each
// alone.
func (c *shard) launch(reqs []*commitReq) *round {
	r := c.r
	rd := &round{t0: time.Now(), at: time.Now().UnixMilli()}
	byPart := map[int]*partitionBatch{}
	for _, q := range reqs {
		if q.seen != c.log.foreignMark(q.partition) {
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
		}
		b.reqs = append(b.reqs, q)
		b.entries = append(b.entries, q.entries...)
	}
	var records [][]byte
	for _, q := range reqs {
		b := byPart[q.partition]
		if b == nil || b.reqs[0] != q {
			continue // taken with its partition's first request
		}
		data, err := changelog.Encode(changelog.Record{Partition: b.partition, At: rd.at, Entries: b.entries})
		if err != nil {
			// What a record cannot encode, the store would refuse too:
			// its requests are committed again, each alone.
			b.refusal = err
			rd.refused = append(rd.refused, b)
			continue
		}
		rd.batches = append(rd.batches, b)
		records = append(records, data)
	}
	if len(rd.batches) == 0 && len(rd.refused) == 0 {
		return nil
	}
	// The appends are bounded (each publish, and the round).
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	rd.cancel = cancel
	rd.seqs, rd.errs = make([]uint64, len(rd.batches)), make([]error, len(rd.batches))
	for i, b := range rd.batches {
		rd.appends.Add(1)
		p, fence := b.partition, c.log.fence(b.partition)
		c.log.appending(p)
		go func() {
			defer rd.appends.Done()
			t := time.Now()
			seq, err := r.clog.Append(ctx, p, fence, records[i])
			r.Metrics.Observe("ctxpipe_changelog_append_seconds", "", time.Since(t))
			if err != nil {
				seq = 0
			}
			rd.seqs[i], rd.errs[i] = seq, err
			c.log.appended(p, seq)
		}()
	}
	return rd
}

// finish applies round rd in a transaction while its appends complete,
// launches the next round from the requests that queued meanwhile (commits
// nil: none), commits rd, and answers its requests. It returns the next
// round, if it launched one.
func (c *shard) finish(rd *round, commits *chan *commitReq) (next *round) {
	r := c.r
	defer rd.cancel()
	// SQLite statements run under a context that cannot be cancelled:
	// go-sqlite3 watches a cancellable one from a goroutine per statement,
	// which costs more than the statement.
	sqlCtx := context.Background()
	seqsOf := map[int]uint64{}
	defer func() {
		c.log.appendDone(seqsOf)
		for _, b := range rd.refused {
			c.retryAlone(b)
		}
	}()
	if rd.doomed != nil {
		rd.appends.Wait()
		for i, b := range rd.batches {
			seqsOf[b.partition] = rd.seqs[i]
		}
		c.failRound(rd.batches, rd.doomed)
		return nil
	}
	t1 := time.Now()
	tx, ok, err := c.begin(sqlCtx, rd.at, rd.batches)
	tApply := time.Since(t1)
	rd.appends.Wait()
	tAppend := time.Since(t1)

	// positions are the partitions' new changelog positions: every record
	// appended, applied or skipped.
	positions := map[int]uint64{}
	for i, b := range rd.batches {
		seqsOf[b.partition] = rd.seqs[i]
		if rd.errs[i] == nil {
			positions[b.partition] = rd.seqs[i]
		}
	}
	if err != nil {
		c.failRound(rd.batches, err)
		return nil
	}
	applied := map[*partitionBatch]bool{}
	for _, b := range ok {
		applied[b] = true
	}
	var logged []*partitionBatch // in the log and applied
	for i, b := range rd.batches {
		switch {
		case rd.errs[i] != nil:
			err := rd.errs[i]
			if errors.Is(err, changelog.ErrLost) {
				if r.logLost.Swap(time.Now().UnixNano()) == 0 {
					r.Log.Error("the changelog lost records this store applied; nothing can be committed until CTX_STATE is restored", "partition", b.partition, "err", err)
				}
				r.Metrics.Inc("ctxpipe_changelog_lost_total", "")
			}
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
				"partition", b.partition, "seq", rd.seqs[i], "err", b.refusal)
			r.Metrics.Inc("ctxpipe_changelog_unreadable_total", "")
			rd.refused = append(rd.refused, b)
		default:
			logged = append(logged, b)
		}
	}
	if len(logged) < len(ok) {
		// A batch applied but not in the log: apply again without it.
		tx.Rollback()
		var more []*partitionBatch
		tx, more, err = c.begin(sqlCtx, rd.at, logged)
		if err != nil {
			c.failRound(logged, err)
			return nil
		}
		for _, b := range logged {
			if !slices.Contains(more, b) {
				r.Log.Error("a change in the changelog cannot be committed here; skipped, its inputs are committed again",
					"partition", b.partition, "err", b.refusal)
				r.Metrics.Inc("ctxpipe_changelog_unreadable_total", "")
				rd.refused = append(rd.refused, b)
			}
		}
		logged = more
	}
	if len(positions) == 0 {
		tx.Rollback()
		return nil
	}
	// While this round's fsync runs, the next round's records are
	// appended; its fences follow this round's records. Not when requests
	// of this one must be committed again first: they come before it.
	if commits != nil && len(rd.refused) == 0 {
		if reqs := c.gather(commits, nil); len(reqs) > 0 {
			next = c.launch(reqs)
		}
	}
	if err := tx.Commit(positions, c.log.cursor); err != nil {
		c.failRound(logged, err)
		if next != nil {
			next.doomed = err
		}
		return next
	}
	for p, seq := range positions {
		c.log.setApplied(p, seq)
	}
	r.storeWorks()
	r.Metrics.Inc("ctxpipe_commits_total", "")
	r.Metrics.Observe("ctxpipe_commit_seconds", "", time.Since(rd.t0))
	// The phases add up to the committer's time on the round: the SQL,
	// then the wait for the appends that outlasted it (they started when
	// the round was launched, maybe during the previous round's commit),
	// then the commit.
	r.Metrics.Observe("ctxpipe_commit_phase_seconds", `phase="apply"`, tApply)
	r.Metrics.Observe("ctxpipe_commit_phase_seconds", `phase="append"`, tAppend-tApply)
	r.Metrics.Observe("ctxpipe_commit_phase_seconds", `phase="sync"`, time.Since(t1)-tAppend)
	// Per file: its committer's busy time, the serial part of its commits.
	r.Metrics.Observe("ctxpipe_commit_file_seconds", fmt.Sprintf(`file="%d"`, c.i), time.Since(t1))
	results := tx.Results()
	events := false
	for i, b := range logged {
		r.committed(b.entries, results[i], true)
		for _, q := range b.reqs {
			q.done <- nil
		}
		events = events || anyEvents(b.entries)
	}
	if events && c.relay != nil {
		c.relay.Notify()
	}
	return next
}

// anyEvents tells whether entries put events in the outbox. Only then is the
// relay woken: each wake costs it a read of the outbox, and most commits
// hold turns that decide nothing (a commit round's read was 2 % of the
// service's CPU under the agent workload). Its poll interval stays the
// backstop.
func anyEvents(entries []store.Entry) bool {
	for _, e := range entries {
		if e.Changes != nil && len(e.Changes.Events) > 0 {
			return true
		}
	}
	return false
}

// failRound fails every request of a round whose SQLite transaction failed
// as a whole (the database locked or failing). Records already in the log
// are the follower's to commit, once the store works again; the workers try
// again meanwhile (their appends are fenced until the follower is done, and
// then find the inputs stored), so an input is still acked only once it is
// in SQLite.
func (c *shard) failRound(batches []*partitionBatch, err error) {
	r := c.r
	r.Log.Error("a commit round failed; the follower will apply what reached the changelog", "err", err)
	r.storeFailing(err)
	c.follower.retry()
	for _, b := range batches {
		for _, q := range b.reqs {
			q.done <- fmt.Errorf("commit %d inputs: %w: %w", len(b.entries), errStoreDown, err)
		}
	}
}

// errStoreDown fails the requests of a round whose transaction failed as a
// whole: the store failed, not their inputs, which are never rejected as
// poison for it.
var errStoreDown = errors.New("the store cannot commit")

// retryAlone commits each request of a batch the store refused alone, so
// that one worker's bad entry does not hold the others back; a request
// alone is answered with the store's refusal (its worker retries it, then
// rejects it as poison).
func (c *shard) retryAlone(b *partitionBatch) {
	if len(b.reqs) > 1 {
		for _, q := range b.reqs {
			c.commitLocal([]*commitReq{q})
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
func (c *shard) begin(ctx context.Context, at int64, batches []*partitionBatch) (tx *store.Tx, kept []*partitionBatch, err error) {
	kept = slices.Clone(batches)
	for {
		groups := make([]store.Group, len(kept))
		for i, b := range kept {
			groups[i] = store.Group{At: at, Entries: b.entries}
		}
		tx, err := c.st.Begin(ctx, groups)
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

// applyFollowed commits the records other writers appended (and moves the
// cursor past everything else) in one transaction.
func (c *shard) applyFollowed(items []changelog.Item) (retried bool) {
	r := c.r
	type rec struct {
		p   int
		seq uint64
		r   *changelog.Record
	}
	var recs []rec
	positions := map[int]uint64{}
	seen := map[int]uint64{}
	var cursor uint64
	for _, it := range items {
		if it.Record == nil && !it.Piece && it.Err == nil && it.Seq > c.log.applied[it.Partition] {
			// Skipped as this instance's own append whose commit then
			// failed: read it again, and nothing after it yet.
			c.follower.retry()
			retried = true
			break
		}
		cursor = max(cursor, it.Seq)
		if it.Partition >= 0 && it.Partition < len(c.log.pieceHead) {
			seen[it.Partition] = max(seen[it.Partition], it.Seq)
			// Anything but a piece ends the partition's run of pieces.
			if !it.Piece {
				c.log.pieceHead[it.Partition] = 0
			}
		}
		switch {
		case it.Err != nil:
			r.Log.Error("changelog message unreadable; skipped", "seq", it.Seq, "partition", it.Partition, "err", it.Err)
			r.Metrics.Inc("ctxpipe_changelog_unreadable_total", "")
		case it.Piece:
			if it.Seq > c.log.applied[it.Partition] {
				c.log.pieceTail[it.Partition] = it.Seq
				if c.log.pieceHead[it.Partition] == 0 {
					c.log.pieceHead[it.Partition] = it.Seq
				}
			}
			continue
		case it.Record != nil && it.Seq > max(c.log.applied[it.Partition], positions[it.Partition]):
			recs = append(recs, rec{it.Partition, it.Seq, it.Record})
			positions[it.Partition] = it.Seq
		}
	}
	old := time.Now().Add(-bus.DuplicateWindow / 2).UnixMilli()
	ctx := context.Background() // not cancellable: see commitLocal
	for {
		groups := make([]store.Group, len(recs))
		for i, x := range recs {
			// The writer's relay publishes these events (it published
			// them long ago when the record is old). The relay here holds
			// recent ones back and publishes only those the event stream
			// lacks when the hold ends: the writer died before its relay
			// got to them.
			groups[i] = store.Group{At: x.r.At, Entries: x.r.Entries, Published: x.r.At < old, Held: true}
		}
		var tx *store.Tx
		var err error
		if len(groups) > 0 {
			tx, err = c.st.Begin(ctx, groups)
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
		// Without a record to apply, only the cursor moves, in memory: the
		// next commit stores it (an fsync of its own per round was a
		// third of a single instance's commits, all for its own records'
		// headers). A cursor stored late only makes a restarted follower
		// skip again what the positions already cover.
		if err == nil && tx != nil {
			err = tx.Commit(positions, cursor)
		}
		if err != nil {
			r.Log.Error("applying the changelog failed; retrying", "err", err)
			r.storeFailing(err)
			c.follower.retry()
			return true
		}
		for p, seq := range positions {
			c.log.setApplied(p, seq)
		}
		for _, x := range recs {
			c.log.setForeign(x.p, x.seq)
		}
		c.log.setCursor(cursor)
		changes := map[int]int{}
		if tx != nil {
			res := tx.Results()
			for i, x := range recs {
				for _, rr := range res[i] {
					if !rr.Duplicate {
						changes[x.p]++
					}
				}
			}
		}
		for p, seq := range seen {
			c.log.setSeen(p, seq)
			if rs, done := r.holds.progress(p, seq, changes[p]); done {
				r.restored(rs)
			}
		}
		if tx != nil {
			res := tx.Results()
			for i, x := range recs {
				r.committed(x.r.Entries, res[i], false)
			}
			r.Metrics.Add("ctxpipe_changelog_applied_total", "", float64(len(recs)))
			events := false
			for _, x := range recs {
				events = events || anyEvents(x.r.Entries)
			}
			if events && c.relay != nil {
				c.relay.Notify()
			}
		}
		return retried
	}
}
