-- 0002: find a conversation's summaries and markers by id without scanning
-- its history, so that the visible-messages query and the hidden count cost
-- O(messages) rather than O(messages²).
CREATE INDEX messages_summaries ON messages (conversation_id, condense_id) WHERE is_summary = 1;
CREATE INDEX messages_markers ON messages (conversation_id, truncation_id) WHERE is_truncation_marker = 1;
