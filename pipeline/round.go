package pipeline

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ctxpipe/ctxpipe/changelog"
	"github.com/ctxpipe/ctxpipe/store"
)

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

// commitLocal commits reqs in a round of their own, not overlapping any
// other.
func (c *committer) commitLocal(reqs []*commitReq) {
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
func (c *committer) launch(reqs []*commitReq) *round {
	rd := &round{t0: time.Now(), at: time.Now().UnixMilli()}
	byPart := map[int]*partitionBatch{}
	for _, q := range reqs {
		if q.seen != c.log.foreignMark(q.partition) {
			// Prepared on a view older than a record the follower applied
			// since (a takeover's catch-up): prepare again.
			c.metrics.Inc("ctxpipe_changelog_fenced_total", "")
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
			seq, err := c.clog.Append(ctx, p, fence, records[i])
			c.metrics.Observe("ctxpipe_changelog_append_seconds", "", time.Since(t))
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
func (c *committer) finish(rd *round, commits *chan *commitReq) (next *round) {
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
				if c.health.lose() {
					c.logger.Error("the changelog lost records this store applied; nothing can be committed until CTX_STATE is restored", "partition", b.partition, "err", err)
				}
				c.metrics.Inc("ctxpipe_changelog_lost_total", "")
			}
			if errors.Is(err, changelog.ErrFenced) {
				c.metrics.Inc("ctxpipe_changelog_fenced_total", "")
			}
			err = appendFailure(err)
			for _, q := range b.reqs {
				q.done <- fmt.Errorf("commit %d inputs: %w", len(b.entries), err)
			}
		case !applied[b]:
			// In the log, refused here: skipped, as a follower skips it.
			c.logger.Error("a change in the changelog cannot be committed here; skipped, its inputs are committed again",
				"partition", b.partition, "seq", rd.seqs[i], "err", b.refusal)
			c.metrics.Inc("ctxpipe_changelog_unreadable_total", "")
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
				c.logger.Error("a change in the changelog cannot be committed here; skipped, its inputs are committed again",
					"partition", b.partition, "err", b.refusal)
				c.metrics.Inc("ctxpipe_changelog_unreadable_total", "")
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
	c.health.works()
	c.metrics.Inc("ctxpipe_commits_total", "")
	c.metrics.Observe("ctxpipe_commit_seconds", "", time.Since(rd.t0))
	// The phases add up to the committer's time on the round: the SQL,
	// then the wait for the appends that outlasted it (they started when
	// the round was launched, maybe during the previous round's commit),
	// then the commit.
	c.metrics.Observe("ctxpipe_commit_phase_seconds", `phase="apply"`, tApply)
	c.metrics.Observe("ctxpipe_commit_phase_seconds", `phase="append"`, tAppend-tApply)
	c.metrics.Observe("ctxpipe_commit_phase_seconds", `phase="sync"`, time.Since(t1)-tAppend)
	// Per file: its committer's busy time, the serial part of its commits.
	c.metrics.Observe("ctxpipe_commit_file_seconds", fmt.Sprintf(`file="%d"`, c.i), time.Since(t1))
	results := tx.Results()
	events := false
	for i, b := range logged {
		c.committed(b.entries, results[i], true)
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
func (c *committer) failRound(batches []*partitionBatch, err error) {
	c.logger.Error("a commit round failed; the follower will apply what reached the changelog", "err", err)
	c.health.failing(err)
	c.follower.retry()
	for _, b := range batches {
		for _, q := range b.reqs {
			q.done <- fmt.Errorf("commit %d inputs: %w: %w", len(b.entries), errStoreDown, err)
		}
	}
}

// appendFailure is what the requests of a batch whose record's append
// failed are answered: a fenced append (another writer appended to the
// partition first) is errBehind, and the batch is prepared again once the
// follower has applied that record; any other failure (the changelog lost
// records this store applied, or did not answer) as it is.
func appendFailure(err error) error {
	if errors.Is(err, changelog.ErrFenced) {
		return errBehind
	}
	return err
}

// errStoreDown fails the requests of a round whose transaction failed as a
// whole: the store failed, not their inputs, which are never rejected as
// poison for it.
var errStoreDown = errors.New("the store cannot commit")

// retryAlone commits each request of a batch the store refused alone, so
// that one worker's bad entry does not hold the others back; a request
// alone is answered with the store's refusal (its worker retries it, then
// rejects it as poison).
func (c *committer) retryAlone(b *partitionBatch) {
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
func (c *committer) begin(ctx context.Context, at int64, batches []*partitionBatch) (tx *store.Tx, kept []*partitionBatch, err error) {
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
