// Package stages is ctxpipe's context engine: every context-management
// decision of Roo Code and Gemini CLI as plain Go over schema types.
//
// The decisions are pure functions — Decide (the threshold), EffectiveHistory,
// PlanTruncation, the three condense planners, VerifyShrink, PlanRewind and
// Cleanup — and Engine.Apply chains them for one input: count the new turn,
// decide, condense (the only effect: a Summarizer call), verify the context
// shrank, fall back to truncation, and return the resulting schema.Changes.
// Nothing here touches NATS, SQLite or HTTP; the service commits the Changes,
// and Conversation applies them in memory for programs that manage context
// in process.
package stages
