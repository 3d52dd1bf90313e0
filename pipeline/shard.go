package pipeline

import (
	"github.com/ctxpipe/ctxpipe/store"
)

// A shard is one file of the instance's store set (store.Set: partition p
// lives in file p mod F) with everything that writes to it: its committer,
// its changelog follower and its view of the changelog (logState). The
// shards share nothing on the commit path, so commits of partitions in
// different files run in parallel and their fsyncs overlap; within a shard
// everything that made one committer's commit safe holds as it did:
//
//   - a round appends each partition's record to CTX_STATE, fenced on the
//     partition's last record, before the file's transaction commits, and
//     acks only after;
//   - a worker's batch is refused when the partition's foreign mark moved
//     while it was prepared;
//   - events go to the file's outbox in the same transaction, and the
//     file's own relay publishes them;
//   - the follower reads only the subjects of the shard's partitions held,
//     and its records are applied between rounds, in log order per
//     partition (a partition is in exactly one shard).
//
// The cursor (where a follower restarts) is per shard and stored in the
// shard's file; the instance's cursor is the least of them.
type shard struct {
	r        *Runner
	i        int // its index in the set
	st       *store.Store
	relay    *store.Relay // optional
	log      *logState
	follower *follower
	commits  chan *commitReq
}

// shardOf is partition p's shard.
func (r *Runner) shardOf(p int) *shard {
	return r.shards[r.Stores.FileOf(p)]
}

// storeOf is partition p's file.
func (r *Runner) storeOf(p int) *store.Store {
	return r.Stores.ForPartition(p)
}

// mine tells whether partition p is in shard c.
func (c *shard) mine(p int) bool {
	return c.r.Stores.FileOf(p) == c.i
}
