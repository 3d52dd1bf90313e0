-- 0003: every input's payload hash and size, so a reused input id can be told
-- from an identical redelivery and a rejected input can keep only a bounded
-- prefix of its payload; the relay's cursor into CTX_EVENTS, so it can find
-- events it published but did not mark.
-- Rows stored before this migration get their hash, size and prefix in Go,
-- in the same transaction (see backfillInputs): SQLite has no sha256.

ALTER TABLE inputs ADD COLUMN payload_hash BLOB;
ALTER TABLE inputs ADD COLUMN payload_size INTEGER NOT NULL DEFAULT 0;

-- Prune finds the rejected payloads it has not cleared yet without scanning
-- every input ever received.
CREATE INDEX inputs_rejected_payloads ON inputs (received_at) WHERE status = 'rejected' AND payload IS NOT NULL;

-- relay_cursor holds the CTX_EVENTS sequence up to which the stream is known
-- to agree with the outbox: every event the stream holds at or below it is
-- marked published here. One row.
CREATE TABLE relay_cursor (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    stream_seq INTEGER NOT NULL
);
