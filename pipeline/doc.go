// Package pipeline runs ctxpipe: it fetches inputs from the CTX_IN durable
// pull consumer, hands each conversation to one worker at a time so its
// inputs apply one after another and in order, runs the engine, commits the
// results of many inputs in one SQLite transaction (events go to the outbox
// in the same transaction), and acks each JetStream message only after the
// commit that holds it. It also answers the ctx.q.* queries.
//
// A conversation waiting on its summarizer holds only itself: other
// conversations go on in other workers and commit without it. The runner
// rebuilds its consumer after any failure a live cluster produces and
// reports what it knows to /readyz.
//
// Ownership is explicit: a conversation hashes to one of Partitions
// partitions. Several instances would each own a set of partitions (see
// DESIGN.md, "Growing past one machine"); today one instance owns them all,
// and InstanceLock refuses a second.
package pipeline
