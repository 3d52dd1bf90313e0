-- 0010: input ids are one namespace per tenant, no longer one for the whole
-- service: the same id sent by two tenants is two inputs, and a tenant that
-- reuses an id another tenant used is told nothing about it. The key becomes
-- (tenant, id), where tenant is the tenant token of the input's subject as
-- published (schema.SubjectTenant: ctx.in.<tenant>.<conv>.<kind>), '' for an
-- input of the service's own account or a subject that names no valid
-- tenant. SQLite cannot change a primary key in place, so the table is
-- copied, rowids and all (Prune and the dashboard go by rowid).
CREATE TABLE inputs_by_tenant (
    tenant          TEXT    NOT NULL,
    id              TEXT    NOT NULL,
    conversation_id TEXT    NOT NULL,
    kind            TEXT    NOT NULL,
    subject         TEXT    NOT NULL,
    ts              INTEGER NOT NULL,
    payload         BLOB,
    status          TEXT    NOT NULL CHECK (status IN ('applied', 'rejected')),
    reason          TEXT    NOT NULL DEFAULT '',
    received_at     INTEGER NOT NULL,
    payload_hash    BLOB,
    payload_size    INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, id)
);

-- The tenant of each row, as schema.SubjectTenant reads it from the subject:
-- ctx.in. followed by exactly three tokens, the first of which is 1-128
-- characters of [A-Za-z0-9_-] not starting with '_'.
INSERT INTO inputs_by_tenant (rowid, tenant, id, conversation_id, kind, subject, ts, payload, status, reason,
    received_at, payload_hash, payload_size)
SELECT rid,
    CASE WHEN length(t) BETWEEN 1 AND 128 AND t NOT GLOB '*[^A-Za-z0-9_-]*' AND t NOT GLOB '_*' THEN t ELSE '' END,
    id, conversation_id, kind, subject, ts, payload, status, reason, received_at, payload_hash, payload_size
FROM (
    SELECT rowid AS rid, *,
        CASE WHEN substr(subject, 1, 7) = 'ctx.in.' AND length(subject) - length(replace(subject, '.', '')) = 4
            THEN substr(subject, 8, instr(substr(subject, 8), '.') - 1) ELSE '' END AS t
    FROM inputs
);

DROP TABLE inputs;
ALTER TABLE inputs_by_tenant RENAME TO inputs;

-- As 0003 made it: Prune's way to the rejected payloads it has not cleared.
CREATE INDEX inputs_rejected_payloads ON inputs (received_at) WHERE status = 'rejected' AND payload IS NOT NULL;
