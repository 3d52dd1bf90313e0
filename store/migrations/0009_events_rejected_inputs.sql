-- wait_for on an input id that was reused in another conversation finds the
-- duplicate_id rejection through its event (store.reusedIDStatus): every
-- wait for an input not committed yet asks, so it must be an index lookup,
-- not a scan of the conversation's rejections.
CREATE INDEX events_rejected_inputs ON events (conversation_id, input_id) WHERE type = 'input_rejected';
