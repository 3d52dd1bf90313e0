-- 0006: how far this database has applied the changelog (CTX_STATE).
-- Every committed change is first appended to its partition's subject
-- ctx.state.<p>; this database is a projection of that log.
-- changelog_positions.seq is the CTX_STATE sequence of the last message of
-- partition p this database reflects; changelog_cursor is the stream
-- sequence up to which the follower has read every partition. Both are
-- per-instance bookkeeping, never compared between databases.
CREATE TABLE changelog_positions (
    partition INTEGER PRIMARY KEY,
    seq       INTEGER NOT NULL
);

CREATE TABLE changelog_cursor (
    id  INTEGER PRIMARY KEY CHECK (id = 0),
    seq INTEGER NOT NULL
);
