-- 0008: messages_by_pos holds each message's seq, and messages_by_seq goes.
-- An incremental read finds the messages stored after a seq by walking a
-- conversation's messages_by_pos backwards until a smaller seq, reading the
-- index alone: while only appends happened since that seq (the only case
-- read incrementally, see 0004), they are the conversation's last messages
-- by position. Every commit paid for messages_by_seq: one more B-tree leaf
-- per conversation per transaction. Without it the WAL writes of
-- BenchmarkCommitBatch fell by a further 10 % (one entry per commit) to
-- 11 % (16 per commit): pwrite64 calls per entry 18.9 -> 17.0 and 8.2 -> 7.3.
DROP INDEX IF EXISTS messages_by_seq;
DROP INDEX IF EXISTS messages_by_pos;
CREATE INDEX messages_by_pos ON messages (conversation_id, pos, seq);
