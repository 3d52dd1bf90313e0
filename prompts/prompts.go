// Package prompts holds the texts ctxpipe sends when it condenses a
// conversation: the system prompts that ask a model for a summary, the final
// user turn that triggers it, and the synthetic blocks the engine inserts into
// a condensed history. The texts live in files beside this one (embedded at
// build time) so they can be reviewed and edited as prose.
package prompts

import (
	_ "embed" // the prompt texts are embedded files
	"strings"

	"github.com/ctxpipe/ctxpipe/schema"
)

var (
	//go:embed detailed.md
	detailed string
	//go:embed snapshot.md
	snapshot string
	//go:embed final.txt
	final string
	//go:embed snapshot_final.txt
	snapshotFinal string
	//go:embed tool_deferred.txt
	toolDeferred string
	//go:embed synthetic_reasoning.txt
	syntheticReasoning string
	//go:embed request_instructions.txt
	requestInstructions string
	//go:embed summary_ack.txt
	summaryAck string
)

// RequestInstructions introduces a manual condense's own instructions, which
// a model summarizer appends to the system prompt (see WithInstructions).
var RequestInstructions = strings.TrimSpace(requestInstructions)

// WithInstructions returns the system prompt with a request's instructions
// appended under RequestInstructions, or the prompt alone when there are none.
func WithInstructions(prompt, instructions string) string {
	in := strings.TrimSpace(instructions)
	if in == "" {
		return prompt
	}
	return prompt + "\n\n" + RequestInstructions + "\n<instructions>\n" + in + "\n</instructions>"
}

// Detailed is the built-in system prompt for keep_tail and fresh_start: a
// structured summary under the six headings in DetailedSections.
var Detailed = strings.TrimSpace(detailed)

// Snapshot is the built-in system prompt for preserve_fraction: an XML
// <state_snapshot> with the goal, knowledge, file state, recent actions and plan.
var Snapshot = strings.TrimSpace(snapshot)

// FinalInstruction is the user turn appended after the messages to summarize
// when the Detailed (or a custom) prompt is used.
var FinalInstruction = strings.TrimSpace(final)

// SnapshotFinalInstruction is the user turn appended when the Snapshot prompt is used.
var SnapshotFinalInstruction = strings.TrimSpace(snapshotFinal)

// ToolDeferred is the text of the synthetic tool_result that answers a tool
// call left pending when a condense cut the conversation, so every tool_use
// keeps its result.
var ToolDeferred = strings.TrimSpace(toolDeferred)

// SyntheticReasoning is the text of the reasoning block placed first in a
// keep_tail summary message; some providers require an assistant turn to open
// with reasoning when the conversation uses it.
var SyntheticReasoning = strings.TrimSpace(syntheticReasoning)

// SummaryAck is the text of the assistant message a preserve_fraction
// condense puts after its user summary (schema.Message.IsSummaryAck).
var SummaryAck = strings.TrimSpace(summaryAck)

// DetailedSections are the six headings the Detailed prompt asks for, in
// order, as they appear after "## ". The offline condenser writes the same
// headings so both kinds of summary read alike.
var DetailedSections = []string{
	"1. Previous conversation",
	"2. Current work",
	"3. Key technical concepts",
	"4. Relevant files and code",
	"5. Problem solving",
	"6. Pending tasks and next steps",
}

// For returns the system prompt and the final instruction for a strategy.
// A custom prompt (after trimming) replaces the built-in one and is paired
// with FinalInstruction; otherwise preserve_fraction uses Snapshot and every
// other strategy uses Detailed.
func For(strategy schema.Strategy, custom string) (prompt, final string) {
	if c := strings.TrimSpace(custom); c != "" {
		return c, FinalInstruction
	}
	if strategy == schema.StrategyPreserveFraction {
		return Snapshot, SnapshotFinalInstruction
	}
	return Detailed, FinalInstruction
}

// IsFinalInstruction reports whether text is one of the final instructions,
// so a condenser can tell the engine's trigger turn from the user's own words.
func IsFinalInstruction(text string) bool {
	t := strings.TrimSpace(text)
	return t != "" && (t == FinalInstruction || t == SnapshotFinalInstruction)
}
