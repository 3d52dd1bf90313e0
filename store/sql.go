package store

const (
	qInsertInput = `INSERT INTO inputs (tenant, id, conversation_id, kind, subject, ts, payload, payload_hash, payload_size,
		status, reason, received_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, id) DO NOTHING`
	qStoredInput   = `SELECT conversation_id, payload_hash FROM inputs WHERE tenant = ? AND id = ?`
	qInsertMessage = `INSERT INTO messages (conversation_id, id, pos, ts, role, is_summary, condense_id, condense_parent,
		is_truncation_marker, truncation_id, truncation_parent, tokens, body, seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	qGetSeq = `SELECT seq, reset_seq FROM history_seq WHERE conversation_id = ?`
	qPutSeq = `INSERT INTO history_seq (conversation_id, seq, reset_seq) VALUES (?, ?, ?)
		ON CONFLICT (conversation_id) DO UPDATE SET seq = excluded.seq, reset_seq = excluded.reset_seq`
	qLastPos   = `SELECT COALESCE(MAX(pos), 0) FROM messages WHERE conversation_id = ?`
	qPosOf     = `SELECT pos FROM messages WHERE conversation_id = ? AND id = ?`
	qPrevPos   = `SELECT MAX(pos) FROM messages WHERE conversation_id = ? AND pos < ?`
	qRenumber  = `UPDATE messages SET pos = r.n FROM (SELECT id, ROW_NUMBER() OVER (ORDER BY pos) AS n FROM messages WHERE conversation_id = ?1) AS r WHERE messages.conversation_id = ?1 AND messages.id = r.id`
	qDelete    = `DELETE FROM messages WHERE conversation_id = ? AND id = ?`
	qPutState  = `INSERT INTO conversations (id, state, updated_at) VALUES (?, ?, ?) ON CONFLICT (id) DO UPDATE SET state = excluded.state, updated_at = excluded.updated_at`
	qPutEvent  = `INSERT INTO events (id, conversation_id, type, ts, input_id, ref_id, body) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING`
	qPutOutbox = `INSERT INTO outbox (event_id, subject, data, published_at, held_since, conv) VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (event_id) DO NOTHING`

	qPutPosition = `INSERT INTO changelog_positions (partition, seq) VALUES (?, ?)
		ON CONFLICT (partition) DO UPDATE SET seq = MAX(seq, excluded.seq)`
	qPutCursor = `INSERT INTO changelog_cursor (id, seq) VALUES (0, ?) ON CONFLICT (id) DO UPDATE SET seq = MAX(seq, excluded.seq)`
)
