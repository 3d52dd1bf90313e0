-- 0012: an event of another writer's changelog record is stored in the
-- outbox held back: the writer's relay publishes it, and this instance's
-- publishes it only if CTX_EVENTS still lacks it when the hold ends (the
-- writer died before its relay sent it). Publishing it at once, as before,
-- sent every live subscriber of ctx.events.> one copy per instance.
-- held_since is the record's commit time (Unix ms), NULL for this
-- instance's own events. conv is the event's conversation: an own event
-- waits behind a held event of its conversation, so that a conversation's
-- events reach the stream in commit order.
ALTER TABLE outbox ADD COLUMN held_since INTEGER;
ALTER TABLE outbox ADD COLUMN conv TEXT;
CREATE INDEX outbox_held ON outbox (conv, seq) WHERE published_at IS NULL AND held_since IS NOT NULL;
