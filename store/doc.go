// Package store keeps ctxpipe's state in SQLite: every input ever accepted,
// each conversation's full message history and small state, every event, and
// the outbox that a Relay publishes to CTX_EVENTS. store.go opens a file (one
// writer connection, since SQLite has one writer and queueing in Go is cheaper
// than SQLITE_BUSY retries; a read-only pool that in WAL mode never waits
// behind it) and runs the embedded migrations; set.go spreads the changelog's
// partitions over several such files. Writes: entry.go is what a batch holds
// (an input and its changes), encode.go makes every JSON body before the write
// lock, tx.go commits groups in one transaction with synchronous=FULL (an
// acked input survives power loss) and records changelog positions, apply.go
// is the per-transaction writer, position.go places inserted messages, sql.go
// holds the statements and rawconn.go runs them bypassing database/sql in bulk
// loads; inputs.go and turnbytes.go keep input rows and their payload hashes
// and answer input status, checkpoint.go copies the WAL back beside the
// commits. Reads: reads.go (one conversation's state and messages), history.go
// (incremental history reads), events.go (a conversation's events), recent.go
// and cache.go (in-memory answers for recent appends and decoded messages),
// listing.go (every conversation at once); rows.go reads a query's rows into a
// slice. The outbox: relay.go publishes it in order, reconcile.go finds what
// the event stream holds already, held.go waits on another writer's events,
// outbox.go marks rows published and prunes them. Upkeep: prune.go clears old
// rejected payloads and published outbox rows; diff.go compares two database
// files row by row, reading each side in key order (diffread.go) and comparing
// values as SQLite orders and stores them (diffvalue.go).
package store
