package schema

// ConversationState is the small per-conversation record the engine reads on
// every input. It lets a turn be decided in O(1): the full history is loaded
// only when a condense, truncation or rewind has to plan over it.
type ConversationState struct {
	ConversationID string `json:"conversation_id"`
	ProfileID      string `json:"profile_id"`
	// ContextTokens is the current context size: the last provider-reported
	// usage (or the last condense/truncation result) plus the local counts of
	// the messages since, as Roo's totalTokens + lastMessageTokens.
	ContextTokens int    `json:"context_tokens"`
	SystemPrompt  string `json:"system_prompt,omitempty"`
	SystemTokens  int    `json:"system_tokens"`
	// CondenseBlocked is Gemini's latch: after an automatic or forced
	// condense whose summary failed (the model erred, said nothing, or grew
	// the context), those triggers only truncate until a condense succeeds
	// or a rewind applies. A refusal before any model call does not set it.
	CondenseBlocked bool `json:"condense_blocked,omitempty"`
	// LastToolUseIDs are the tool_use ids of the latest assistant turn, which
	// a following tool_result must answer.
	LastToolUseIDs []string `json:"last_tool_use_ids,omitempty"`
	Messages       int      `json:"messages"` // stored messages, hidden ones included
	Condensations  int      `json:"condensations"`
	Truncations    int      `json:"truncations"`
	LastTS         int64    `json:"last_ts"`
	// Pins are the pin inputs' verdicts by message id, which override the
	// pinned flag a turn was stored with (true pins, false unpins). Bounded
	// by MaxPins; a rewind drops the entries of deleted messages.
	Pins map[string]bool `json:"pins,omitempty"`
	// ContinuesFrom is the key of the conversation this one continues, as
	// the first turn that named one said (Turn.ContinuesFrom); "" when none.
	ContinuesFrom string `json:"continues_from,omitempty"`
}

// MaxPins bounds ConversationState.Pins, so the state read on every input
// stays small.
const MaxPins = 1000

// IsPinned reports whether message m is pinned: the pin inputs' verdict if
// any, else the flag it was stored with. A masked stand-in follows its
// original.
func (st *ConversationState) IsPinned(m *Message) bool {
	id := m.ID
	if m.MaskOf != "" {
		id = m.MaskOf
	}
	if v, ok := st.Pins[id]; ok {
		return v
	}
	return m.Pinned
}

// TagField names one of the two parent tags.
type TagField string

// The parent tags a message can carry.
const (
	TagCondenseParent   TagField = "condense_parent"
	TagTruncationParent TagField = "truncation_parent"
)

// TagChange sets (Value != "") or clears (Value == "") a parent tag.
type TagChange struct {
	MessageID string   `json:"message_id"`
	Field     TagField `json:"field"`
	Value     string   `json:"value"`
}

// Insertion places a new message before the message with id Before, or at the
// end when Before is "".
type Insertion struct {
	Message Message `json:"message"`
	Before  string  `json:"before,omitempty"`
}

// ContextEventRef is a condense or truncation that a rewind may undo: the
// summary or marker id and the ts of the event that announced it.
type ContextEventRef struct {
	Type EventType `json:"type"`
	ID   string    `json:"id"` // condense_id or truncation_id
	TS   int64     `json:"ts"`
}

// Changes is everything one input does to a conversation. The store commits
// it in one transaction (with the events in the outbox); Apply replays it on
// an in-memory history. Changes never delete a message except in a rewind.
type Changes struct {
	Insert []Insertion       `json:"insert,omitempty"`
	Tags   []TagChange       `json:"tags,omitempty"`
	Delete []string          `json:"delete,omitempty"`
	Events []Event           `json:"-"`
	State  ConversationState `json:"state"`
}
