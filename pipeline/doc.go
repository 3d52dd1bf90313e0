// Package pipeline runs ctxpipe's instances: each consumes its share of
// CTX_IN's partitions and keeps the state of the partitions it holds.
//
// What is where:
//   - runner.go, sched.go: fetch → lane → prepare (the engine) → commit →
//     ack. A partition's inputs are pulled from its pinned durable consumer;
//     each conversation is handed to one lane at a time, so its inputs apply
//     in order, and a conversation waiting on its summarizer holds only
//     itself.
//   - shard.go, committer.go: one committer per store file. A round appends
//     each partition's changelog record (fenced) to CTX_STATE before its
//     SQLite transaction commits; events go to the outbox in the same
//     transaction; inputs are acked only after the commit.
//   - follower.go: applies other writers' records of the held partitions,
//     in log order per partition, and restores a partition gained without
//     a copy before any of its inputs is applied.
//   - holders.go, holding.go, balance.go, lock.go, live.go, adopt.go:
//     ownership. Rendezvous ranking over the live instances (ctx_locks)
//     decides, before any input arrives, which instance owns each partition
//     and which --standby instances follow it; a new owner's term replays
//     the unacked inputs (partitions.go), and an owner that went silent has
//     its inputs adopted.
//   - queries.go, route.go, waiters.go: the ctx.q.* queries, answered by an
//     instance that holds the conversation's partition; any other passes
//     the query on over ctx.own.<p>.<tenant>.<verb>.
//   - strays.go: inputs stored where no partition reads them are rejected.
//   - health.go, metrics.go, profiles.go, publish.go, config.go: /readyz,
//     /metrics, the profiles bucket watch, event and progress publishing,
//     the runner's settings.
//
// docs/operations.md, section 4, describes the same from an operator's side.
package pipeline
