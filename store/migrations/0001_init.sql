-- 0001: the first schema. Every accepted input, every stored message, every
-- event and the outbox that carries events to CTX_EVENTS.

-- inputs keeps every payload ever accepted, applied or rejected; its primary
-- key is the idempotency guard after JetStream's dedup window.
CREATE TABLE inputs (
    id              TEXT    PRIMARY KEY,
    conversation_id TEXT    NOT NULL,
    kind            TEXT    NOT NULL,
    subject         TEXT    NOT NULL,
    ts              INTEGER NOT NULL,
    payload         BLOB,
    status          TEXT    NOT NULL CHECK (status IN ('applied', 'rejected')),
    reason          TEXT    NOT NULL DEFAULT '',
    received_at     INTEGER NOT NULL
);
CREATE INDEX inputs_by_conversation ON inputs (conversation_id, ts);

-- conversations holds the small per-conversation state the engine reads on
-- every input (schema.ConversationState as JSON).
CREATE TABLE conversations (
    id         TEXT    PRIMARY KEY,
    state      TEXT    NOT NULL,
    updated_at INTEGER NOT NULL
);

-- messages is the full history. pos orders it; the mutable parent tags live
-- only in their columns (the body is stored with them empty) so the two can
-- never disagree.
CREATE TABLE messages (
    conversation_id      TEXT    NOT NULL,
    id                   TEXT    NOT NULL,
    pos                  REAL    NOT NULL,
    ts                   INTEGER NOT NULL,
    role                 TEXT    NOT NULL,
    is_summary           INTEGER NOT NULL DEFAULT 0,
    condense_id          TEXT    NOT NULL DEFAULT '',
    condense_parent      TEXT    NOT NULL DEFAULT '',
    is_truncation_marker INTEGER NOT NULL DEFAULT 0,
    truncation_id        TEXT    NOT NULL DEFAULT '',
    truncation_parent    TEXT    NOT NULL DEFAULT '',
    tokens               INTEGER NOT NULL DEFAULT 0,
    body                 BLOB    NOT NULL,
    PRIMARY KEY (conversation_id, id)
);
CREATE INDEX messages_by_pos ON messages (conversation_id, pos);

-- events is the permanent record of every decision.
CREATE TABLE events (
    id              TEXT    PRIMARY KEY,
    conversation_id TEXT    NOT NULL,
    type            TEXT    NOT NULL,
    ts              INTEGER NOT NULL,
    input_id        TEXT    NOT NULL,
    ref_id          TEXT    NOT NULL DEFAULT '',
    body            BLOB    NOT NULL
);
CREATE INDEX events_by_conversation ON events (conversation_id, type, ts);

-- outbox is what the relay still has to publish, in seq order.
CREATE TABLE outbox (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id     TEXT    NOT NULL UNIQUE,
    subject      TEXT    NOT NULL,
    data         BLOB    NOT NULL,
    published_at INTEGER
);
CREATE INDEX outbox_unpublished ON outbox (seq) WHERE published_at IS NULL;
