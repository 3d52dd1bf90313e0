package pipeline

import (
	"context"
	"errors"
	"time"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/changelog"
	"github.com/ctxpipe/ctxpipe/store"
)

// rereadLogEvery spaces the lines that say the follower reads a message
// again.
const rereadLogEvery = 5 * time.Second

// applyFollowed commits the records other writers appended (and moves the
// cursor past everything else) in one transaction.
func (c *committer) applyFollowed(items []changelog.Item) (retried bool) {
	type rec struct {
		p      int
		seq    uint64
		record *changelog.Record
	}
	var recs []rec
	positions := map[int]uint64{}
	seen := map[int]uint64{}
	var cursor uint64
	for _, it := range items {
		if it.Record == nil && !it.Piece && it.Err == nil && it.Seq > c.log.applied[it.Partition] {
			// Skipped as this instance's own append whose commit then
			// failed, or as another writer's while an append of this
			// instance was in flight (fenced then): read it again, with
			// its data (rereading), and nothing after it yet. Said once
			// in a while: a follower that keeps reading such a message
			// again makes no progress, and nothing else would tell.
			if time.Since(c.lastReread) > rereadLogEvery {
				c.lastReread = time.Now()
				c.logger.Warn("a changelog message taken for this instance's own is not in its store; reading it again",
					"partition", it.Partition, "seq", it.Seq, "applied", c.log.applied[it.Partition])
			}
			c.metrics.Inc("ctxpipe_changelog_reread_total", "")
			c.log.rereading(it.Partition, it.Seq)
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
			c.logger.Error("changelog message unreadable; skipped", "seq", it.Seq, "partition", it.Partition, "err", it.Err)
			c.metrics.Inc("ctxpipe_changelog_unreadable_total", "")
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
			groups[i] = store.Group{At: x.record.At, Entries: x.record.Entries, Published: x.record.At < old, Held: true}
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
			c.logger.Error("changelog record cannot be applied here; skipped", "partition", recs[ge.Group].p, "seq", recs[ge.Group].seq, "err", ge.Err)
			c.metrics.Inc("ctxpipe_changelog_unreadable_total", "")
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
			c.logger.Error("applying the changelog failed; retrying", "err", err)
			c.health.failing(err)
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
			c.handled(p, seq, changes[p])
		}
		if tx != nil {
			res := tx.Results()
			for i, x := range recs {
				c.committed(x.record.Entries, res[i], false)
			}
			c.metrics.Add("ctxpipe_changelog_applied_total", "", float64(len(recs)))
			events := false
			for _, x := range recs {
				events = events || anyEvents(x.record.Entries)
			}
			if events && c.relay != nil {
				c.relay.Notify()
			}
		}
		return retried
	}
}
