-- 0005: drop 0004's covering index of the message tags. Incremental history
-- reads no longer walk a conversation's tags (they read the messages stored
-- after a seq, through messages_by_seq, and a short tail), and SQLite took
-- the index for the correlated summary and marker lookups of queries that
-- do not name their index (the dashboard's hidden count), scanning the whole
-- conversation for each hidden message instead of using the partial indexes
-- of 0002.
DROP INDEX IF EXISTS messages_tags;
