-- 0004: each conversation's change sequence, so a reader can fetch only what
-- changed since its last read. history_seq.seq is bumped by every commit that changes the
-- conversation's messages or tags; reset_seq is the seq of the last such
-- commit that did more than append turns (a condense, truncation, mask,
-- pin, rewind or an insertion before another message). messages.seq is the
-- seq of the commit that stored the message. A reader that has read the
-- history at seq A gets only the messages with seq > A while reset_seq <= A;
-- otherwise the whole history again. Rows stored before this have seq 0.

ALTER TABLE messages ADD COLUMN seq INTEGER NOT NULL DEFAULT 0;

-- The messages stored after a seq, found without reading the rows: seq sits
-- after the body, past its overflow pages.
CREATE INDEX messages_by_seq ON messages (conversation_id, seq);

-- A history read walks the tags of every message in position order, and
-- the cache holds the decoded bodies: this index answers that walk without
-- touching the rows, which hold the bodies (about a page each).
CREATE INDEX messages_tags ON messages (conversation_id, pos, id, is_summary, condense_id, condense_parent,
    is_truncation_marker, truncation_id, truncation_parent, tokens);

CREATE TABLE history_seq (
    conversation_id TEXT    PRIMARY KEY,
    seq             INTEGER NOT NULL,
    reset_seq       INTEGER NOT NULL
) WITHOUT ROWID;
