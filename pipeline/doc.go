// Package pipeline runs ctxpipe: it fetches inputs from the CTX_IN durable
// pull consumer, hands each conversation to one lane so its inputs apply one
// at a time and in order, runs the engine, commits the results of many
// inputs in one SQLite transaction (events go to the outbox in the same
// transaction), and acks each JetStream message only after the commit that
// holds it. It also answers the ctx.q.* queries.
//
// Ownership is explicit: a conversation hashes to one of Partitions
// partitions, and a partition to one lane. Several instances would each own a
// set of partitions (see DESIGN.md, "Growing past one machine"); today one
// instance owns them all.
package pipeline
