// Package pipeline runs ctxpipe's instances: each consumes its share of
// CTX_IN's partitions and keeps the state of the partitions it holds.
//
// What is where:
//   - runner.go: the Runner's job, fetch → lane → prepare → commit → ack;
//     New and wire.go wire the parts below to it. partitions.go pulls each
//     partition's pinned durable consumer (a new pin starts a term:
//     takeover.go catches up and replays the unacked inputs); sched.go
//     hands each conversation to one lane at a time, so its inputs apply
//     in order and a conversation waiting on its summarizer holds only
//     itself; prepare.go turns a batch into entries (the engine, or a
//     rejection); retry.go decides what a failed batch does (retry, split,
//     wait for the follower, poison); held.go bounds the inputs held;
//     job.go is a fetched input.
//   - committer.go, round.go, followed.go: one committer per store file. A
//     round appends each partition's changelog record to CTX_STATE, fenced
//     (logstate.go: the fence, the foreign mark, the cursor), before its
//     SQLite transaction commits; events go to the outbox in the same
//     transaction; inputs are acked only after the commit. Between rounds
//     it applies the records of other writers.
//   - follower.go: reads the changelog of the held partitions into their
//     committer, in log order per partition, and restores a partition
//     gained without a copy before any of its inputs is applied.
//   - balance.go, holders.go, holding.go, lock.go, live.go, adopt.go:
//     ownership. Rendezvous ranking over the live instances (ctx_locks)
//     decides, before any input arrives, which instance owns each partition
//     and which --standby instances follow it; an owner that went silent
//     has its inputs adopted.
//   - queries.go, history.go, verbs.go, waiters.go, route.go, browse.go,
//     list.go: the query server. The ctx.q.* queries are answered by the instance
//     that owns the conversation's partition; any other passes the query
//     on over ctx.own.<p>.<tenant>.<verb>. The dashboard's lists are
//     gathered from every instance.
//   - strays.go: inputs stored where no partition reads them are rejected.
//   - health.go, metrics.go, series.go, profiles.go, publish.go, config.go:
//     /readyz, the /metrics registry and the runner's series, the profiles
//     bucket watch, event and progress publishing, the runner's settings.
//
// docs/operations.md, section 4, describes the same from an operator's side.
package pipeline
