-- 0011: a turn's bytes are stored once, in its message. An applied turn's
-- input row held the payload as published beside the message that holds
-- the same turn (its body, which every history read serves); it keeps the
-- payload's sha256 and size, which is all the duplicate and reused-id
-- checks read, and its payload becomes NULL, as a commit now writes it
-- (store.payloadInMessage). Every applied turn inserted its message under
-- its own id, so this is every applied turn's row, also one whose message a
-- rewind deleted since: a database rebuilt from the changelog holds the
-- same rows. The pages freed are reused by later writes.
UPDATE inputs SET payload = NULL WHERE status = 'applied' AND kind = 'turn' AND payload IS NOT NULL;
