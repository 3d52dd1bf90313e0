// Package bus holds what the ctxpipe service and its clients share about
// NATS: streams.go names the streams, the consumer, the profiles bucket and
// the queue group and gives their configurations; reconcile.go creates them
// or reconciles existing ones, reporting each difference as a Finding;
// partitions.go is CTX_IN's partition transform and the changelog's
// per-partition subjects, strays.go the subjects no partition delivers;
// conn.go connects (flags, environment, retries at start), retry.go retries
// a start step against a JetStream not ready yet (RetryStart, Transient),
// and publish.go publishes an input so that JetStream can drop duplicates.
package bus
