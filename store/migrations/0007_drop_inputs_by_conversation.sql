-- 0007: drop 0001's index of inputs by conversation and time. No query has
-- ever used it (inputs are found by id, by rowid, or through
-- inputs_rejected_payloads), and every commit paid for it: one more B-tree
-- leaf per conversation per transaction, written to the WAL and again at
-- the checkpoint. Dropping it cut the WAL writes of BenchmarkCommitBatch by
-- 8 % (one entry per commit) to 11 % (16 per commit).
DROP INDEX IF EXISTS inputs_by_conversation;
