// Package changelog holds CTX_STATE, the log every committed change goes to
// before it is committed to SQLite. An instance's SQLite database is a
// projection of this log, so another instance can take a partition over, or
// a database be rebuilt, from the streams alone: replaying a record runs no
// LLM call and counts no token, it stores what the record says.
//
// record.go is the record format (Encode, Decode); log.go appends a record
// with a per-partition fence (Log.Append), cutting it into messages that fit
// the server's max payload, and assemble.go puts them back together
// (Assembler); follow.go reads the stream in order (Follow from the start,
// FollowLive for a running instance, reading headers only while it holds
// what it reads), and watch.go is the follower's watchdog for an ordered
// consumer that stalls; rebuild.go replays the log into a store or a set of
// stores (Rebuild, RebuildSet).
package changelog
