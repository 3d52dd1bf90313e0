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
	// Tokens is this message's count (fudge factor applied), taken once when
	// the message is stored.
	Tokens int `json:"tokens"`
}

// Synthetic reports whether ctxpipe made the message (a summary or a marker)
// rather than an agent.
func (m *Message) Synthetic() bool { return m.IsSummary || m.IsTruncationMarker }
