package schema

// SummaryRequest is what the engine asks a condenser to summarize. Messages
// are already prepared for the summarizer (images stripped; for fresh_start,
// tool blocks turned into text) and end with the final instruction turn.
type SummaryRequest struct {
	ConversationID string
	// Prompt is the condensing instruction (the profile's custom prompt, or
	// the strategy's built-in one), sent as the system message.
	Prompt   string
	Messages []Message
	Profile  Profile
	Strategy Strategy
}

// Summary is a condenser's answer.
type Summary struct {
	Text         string
	Model        string
	InputTokens  int
	OutputTokens int
	Cost         float64 // USD, from the response's usage and the profile's prices
}
