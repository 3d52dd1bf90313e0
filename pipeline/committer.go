package pipeline

import (
	"context"
	"errors"
	"log/slog"
	"time"

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

// A committer is the only writer of one file of the instance's store set
// (store.Set: partition p lives in file p mod F). It takes the workers'
// batches (appending each partition's record to the changelog before
// committing them) and the follower's records (other writers' appends),
// one transaction at a time: with synchronous=FULL each transaction costs
// an fsync, so grouping many inputs into one is what makes durable acks
// cheap. Committers share nothing on the commit path, so commits of
// partitions in different files run in parallel and their fsyncs overlap;
// within one file:
//
//   - a round appends each partition's record to CTX_STATE, fenced on the
//     partition's last record (logState.fence), before the file's
//     transaction commits, and its inputs are acked only after;
//   - a worker's batch is refused when the partition's foreign mark moved
//     while it was prepared;
//   - events go to the file's outbox in the same transaction, and the
//     file's own relay publishes them;
//   - the follower reads only the subjects of the file's partitions held,
//     and its records are applied between rounds, in log order per
//     partition (a partition is in exactly one file).
//
// The cursor (where a follower restarts) is per file and stored in the
// file; the instance's cursor is the least of them.
type committer struct {
	i       int // its index in the set
	st      *store.Store
	relay   *store.Relay // optional
	log     *logState
	commits chan *commitReq
	// follower reads the file's partitions' changelog into run; the
	// committer drops what it read before its last retry, and asks it to
	// read again when what it read cannot be applied.
	follower followSource
	// clog appends the rounds' records to CTX_STATE.
	clog appender
	// maxBatch and maxBytes bound a round (Config.MaxBatch, MaxCommitBytes).
	maxBatch, maxBytes int
	health             *storeHealth
	metrics            *Metrics
	// lastReread is when applyFollowed last said it reads a message again.
	lastReread time.Time
	logger     *slog.Logger
	// committed is told what each commit stored: own is true for the
	// workers' inputs, false for other writers' records.
	committed func(entries []store.Entry, results []store.Result, own bool)
	// handled is told that partition p's changelog messages are handled up
	// to seq, changes of other writers' inputs applied with them.
	handled func(p int, seq uint64, changes int)
}

// followSource is what a committer needs of its follower.
type followSource interface {
	// current tells whether it was read after the last retry.
	current(followed) bool
	// retry makes the follower read again from the cursor.
	retry()
}

// appender appends a partition's record to the changelog, fenced: it
// fails with changelog.ErrFenced unless after is the partition's last
// sequence (changelog.Log).
type appender interface {
	Append(ctx context.Context, p int, after uint64, data []byte) (uint64, error)
}

// run commits the workers' requests from c.commits and the followed items
// from follow until both are closed.
//
// Rounds overlap by one step: while a round's transaction commits (the
// fsync), the next round's records are already being appended. The
// follower's records are applied only between rounds, never while a
// launched round is pending: its requests were checked against the
// partitions' foreign marks when it was launched.
func (c *committer) run(follow <-chan followed) {
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
			for k < len(items) && !waits(next, items[k], c.log.applied) {
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
func (c *committer) takeFollowed(follow *<-chan followed, limit int) []changelog.Item {
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
func (c *committer) gather(commits *chan *commitReq, first *commitReq) []*commitReq {
	var reqs []*commitReq
	n, size := 0, 0
	if first != nil {
		n, size = len(first.entries), first.size()
	}
	for *commits != nil && n < c.maxBatch && size < c.maxBytes {
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

// waits tells whether a followed item must wait until the pending round
// next is committed: a record, or a piece of one, of a partition next
// appends to (applied now, it would come before next's own record, which
// precedes it in the log), or a message of such a partition this store does
// not reflect yet (next's own record, skipped as held, or one skipped while
// next appended). What this store already reflects goes through: on a
// single instance that is every round's own record, seen while the next
// round is pending. applied is, per partition, the last record the store
// reflects (logState.applied).
func waits(next *round, it changelog.Item, applied []uint64) bool {
	if !next.touches(it.Partition) {
		return false
	}
	return it.Record != nil || it.Piece || it.Seq > applied[it.Partition]
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
