// Package engine is ctxpipe's context engine: every context-management
// decision of Roo Code and Gemini CLI as plain Go over schema types.
//
// The decisions are pure functions — Decide (the threshold, threshold.go),
// EffectiveHistory, PlanMask, PlanTruncation, the condense planner
// (condense.go) with one file per strategy (keeptail.go, freshstart.go,
// preservefraction.go) and the summarizer's request (summaryrequest.go),
// MustKeep, VerifyShrink, PlanRewind and Cleanup, and the rules of one
// reduction (reduce.go: when a masking is due, worth making and enough,
// when a condense is worth trying, what a summarizer's answer means, when
// a failure latches) — and Engine.Apply (engine.go) chains them for one
// input: count the new turn, decide, then (manage.go) mask, condense (the
// only effect: a Summarizer call), verify the context shrank, fall back to
// truncation, end a forced reduction that reduced nothing explicitly
// (unreduced.go), and return the resulting schema.Changes. The facts a
// stand-in or a truncation marker quotes come from textfacts. Nothing here
// touches NATS, SQLite or HTTP; the service commits the Changes, and
// Conversation applies them in memory for programs that manage context in
// process.
package engine
