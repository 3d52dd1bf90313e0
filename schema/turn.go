package schema

import "math"

// Role is who spoke a turn.
type Role string

// The roles a stored message may have. System prompts travel on the turn
// (system_prompt), not as messages, as in the Anthropic API.
const (
	RoleUser      Role = "user"
	RoleAssistant Role = "assistant"
)

// Usage is what the provider reported for the request that produced an
// assistant turn. When present it is the ground truth for the context size.
// Turn.Validate bounds each field and their sum by MaxTokenCount.
type Usage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
}

// Total is the context size the provider saw: the prompt plus the reply. It
// saturates instead of wrapping, so even a usage that was never validated
// cannot come out negative (or positive from two negatives).
func (u Usage) Total() int { return addSat(u.InputTokens, u.OutputTokens) }

// addSat is a + b clamped to the int range.
func addSat(a, b int) int {
	s := a + b
	switch {
	case a > 0 && b > 0 && s < 0:
		return math.MaxInt
	case a < 0 && b < 0 && s >= 0:
		return math.MinInt
	}
	return s
}

// TurnSchemaID names the JSON Schema of a Turn (schema/turn.schema.json).
const TurnSchemaID = "ctxpipe.turn.v1"

// Turn is one conversation turn as an agent publishes it on ctx.in.<conv>.turn.
type Turn struct {
	ID             string  `json:"id"`
	ConversationID string  `json:"conversation_id"`
	AgentID        string  `json:"agent_id,omitempty"`
	ProfileID      string  `json:"profile_id,omitempty"`
	TS             int64   `json:"ts"`
	Role           Role    `json:"role"`
	Content        Content `json:"content"`
	SystemPrompt   string  `json:"system_prompt,omitempty"`
	Usage          *Usage  `json:"usage,omitempty"`
	// Pinned asks that the turn stay verbatim in the effective history
	// through every reduction (condense, masking, truncation). A pin input
	// can change it later (ConversationState.Pins).
	Pinned bool `json:"pinned,omitempty"`
	// ContinuesFrom names the conversation this one continues: the agent's
	// history stopped extending that one's (it compacted it, or edited an
	// earlier message), so the rest goes on here. The agent sends the id
	// without a tenant, as conversation_id; DecodeInput makes it the key in
	// the turn's own tenant, so a link never leaves the tenant. The first
	// turn that names one records it (ConversationState.ContinuesFrom) with
	// a conversation_forked event.
	ContinuesFrom string `json:"continues_from,omitempty"`
}

// Message is a stored message: a turn, a summary or a truncation marker, with
// the non-destructive tags. Hiding a message only ever sets a tag; the message
// stays stored and comes back when the summary or marker it points to is gone.
type Message struct {
	Turn
	IsSummary          bool   `json:"is_summary,omitempty"`
	CondenseID         string `json:"condense_id,omitempty"`
	CondenseParent     string `json:"condense_parent,omitempty"`
	IsTruncationMarker bool   `json:"is_truncation_marker,omitempty"`
	TruncationID       string `json:"truncation_id,omitempty"`
	TruncationParent   string `json:"truncation_parent,omitempty"`
	// MaskOf is set on a masked stand-in: the id of the stored message whose
	// tool results it shows masked. A stand-in is also a summary (IsSummary,
	// CondenseID = the mask id) so that everything that reads the two parent
	// tags, the store's queries included, hides the original behind it; the
	// original is tagged condense_parent = the mask id. MaskedAt is the ts of
	// the input that masked it: a rewind to that ts or earlier undoes it.
	MaskOf   string `json:"mask_of,omitempty"`
	MaskedAt int64  `json:"masked_at,omitempty"`
	// IsSummaryAck marks the assistant message a preserve_fraction condense
	// puts right after its user summary when a user message follows (or
	// nothing does), as Gemini CLI answers its state snapshot with a model
	// turn: the effective history then never holds two user messages in a
	// row there. It is a summary too (IsSummary, the summary's CondenseID),
	// so it lives and goes with its summary: a rewind that undoes the
	// condense deletes both.
	IsSummaryAck bool `json:"is_summary_ack,omitempty"`
	// Tokens is this message's count (fudge factor applied), taken once when
	// the message is stored.
	Tokens int `json:"tokens"`
}

// Synthetic reports whether ctxpipe made the message (a summary or a marker)
// rather than an agent.
// A masked stand-in is synthetic too: the agent's own message is the
// original it stands in for.
func (m *Message) Synthetic() bool { return m.IsSummary || m.IsTruncationMarker }

// IsMask reports whether m is a masked stand-in (see MaskOf).
func (m *Message) IsMask() bool { return m.MaskOf != "" }

// IsCondenseSummary reports whether m is a condense's summary: a summary that
// is neither a masked stand-in nor a summary's acknowledgement.
func (m *Message) IsCondenseSummary() bool { return m.IsSummary && m.MaskOf == "" && !m.IsSummaryAck }
