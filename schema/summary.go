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
	// Source is the span as Messages holds it but with tool blocks intact
	// (fresh_start sends them as text) and unmasked (a profile that masks
	// sends stand-ins and clipped inputs), for what a condenser takes
	// mechanically: the files touched, the last error. Nil means Messages.
	Source []Message
	// Instructions are a manual condense's own instructions ("keep the
	// failing test names"), at most MaxInstructionsLen characters; a model
	// summarizer adds them to its prompt.
	Instructions string
}

// Summary is a condenser's answer.
type Summary struct {
	Text         string
	Model        string
	InputTokens  int
	OutputTokens int
	Cost         float64 // USD, from the response's usage and the profile's prices
}
