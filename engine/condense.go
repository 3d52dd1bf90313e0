package engine

import (
	"github.com/ctxpipe/ctxpipe/prompts"
	"github.com/ctxpipe/ctxpipe/schema"
)

// NMessagesToKeep is how many of the latest messages a keep_tail condense
// leaves untouched (Roo's N_MESSAGES_TO_KEEP).
const NMessagesToKeep = 3

// PreserveFraction of the characters a preserve_fraction condense keeps
// (Gemini's COMPRESSION_PRESERVE_THRESHOLD); the rest is summarized.
const PreserveFraction = 0.3

// CondensePlan is a condense chosen but not yet summarized: the request for
// the summarizer and how to apply its answer.
type CondensePlan struct {
	Strategy   schema.Strategy
	CondenseID string
	Request    schema.SummaryRequest
	finish     func(summary string, count func(schema.Content) int) Condensed
}

// Condensed is a condense applied in memory.
type Condensed struct {
	Changes           schema.Changes
	History           []schema.Message // full history after the condense
	Summary           schema.Message
	MessagesCondensed int
}

// Finish applies the summarizer's text: tags the condensed messages and
// inserts the summary message. count gives the summary's token count.
func (p *CondensePlan) Finish(summary string, count func(schema.Content) int) Condensed {
	return p.finish(summary, count)
}

// CondenseOptions refine a condense.
type CondenseOptions struct {
	// Keep are the ids of messages that must stay visible (MustKeep).
	Keep map[string]bool
	// Instructions are a manual request's own instructions to the summarizer.
	Instructions string
	// MaskResults sends the summarizer every tool result of its span as a
	// masked stand-in (the profile masks): the summary should not repeat
	// tool output, and the stand-ins keep the tool, its key arguments and
	// the last error line.
	MaskResults bool
}

// PlanCondense chooses what to summarize with the profile's strategy,
// keeping what MustKeep says must survive (pinned flags as stored). It
// returns a *schema.Error with ReasonNotEnoughMessages or
// ReasonCondensedRecently when there is nothing worth condensing.
func PlanCondense(msgs []schema.Message, p *schema.Profile, inputID string) (*CondensePlan, error) {
	return PlanCondenseWith(msgs, p, inputID, CondenseOptions{Keep: MustKeep(msgs, nil, p)})
}

// PlanCondenseWith is PlanCondense with explicit options.
func PlanCondenseWith(msgs []schema.Message, p *schema.Profile, inputID string, o CondenseOptions) (*CondensePlan, error) {
	id := DeriveID(inputID, "condense")
	var plan *CondensePlan
	var err error
	keep := o.Keep
	if keep == nil {
		keep = map[string]bool{}
	}
	switch s := p.StrategyOrDefault(); s {
	case schema.StrategyFreshStart:
		plan, err = planFreshStart(msgs, id, keep, o.MaskResults)
	case schema.StrategyPreserveFraction:
		plan, err = planPreserveFraction(msgs, id, keep)
		if err == nil && o.MaskResults {
			plan.Request.Source = plan.Request.Messages
			plan.Request.Messages = maskRequest(plan.Request.Messages, msgs)
		}
	default:
		plan, err = planKeepTail(msgs, id, keep)
		if err == nil && o.MaskResults {
			plan.Request.Source = plan.Request.Messages
			plan.Request.Messages = maskRequest(plan.Request.Messages, msgs)
		}
	}
	if err != nil {
		return nil, err
	}
	prompt, final := prompts.For(plan.Strategy, p.CustomPrompt)
	plan.CondenseID = id
	plan.Request.Prompt = prompt
	plan.Request.Profile = *p
	plan.Request.Strategy = plan.Strategy
	plan.Request.Instructions = o.Instructions
	if len(msgs) > 0 {
		plan.Request.ConversationID = msgs[0].ConversationID
	}
	plan.Request.Messages = append(stripImages(plan.Request.Messages), schema.Message{
		Turn: schema.Turn{Role: schema.RoleUser, Content: schema.TextContent(final)},
	})
	return plan, nil
}

// summaryContent is a user summary's content: the summarizer's text, then
// the first message's <command> blocks, which must survive every condense.
func summaryContent(text, commands string) schema.Content {
	blocks := []schema.Block{{Type: schema.BlockText, Text: text}}
	if commands != "" {
		blocks = append(blocks, schema.Block{Type: schema.BlockText, Text: "<system-reminder>\n" + commands + "\n</system-reminder>"})
	}
	return schema.BlockContent(blocks...)
}

func summaryMessage(id string, ref *schema.Message, role schema.Role, ts int64, c schema.Content, count func(schema.Content) int) schema.Message {
	return schema.Message{
		Turn: schema.Turn{
			ID:             DeriveID(id, "summary"),
			ConversationID: ref.ConversationID,
			ProfileID:      ref.ProfileID,
			TS:             ts,
			Role:           role,
			Content:        c,
		},
		IsSummary:  true,
		CondenseID: id,
		Tokens:     count(c),
	}
}

// condenseAt hides message i behind condense id, unless a condense hides
// it already or it must stay (keep), and returns what that adds to the
// condense's messages_condensed: one if the message was in the effective
// history, nothing if an earlier truncation hid it already (it is tagged
// all the same) or if it is a truncation marker (a truncation's
// messages_removed and a rewind's messages_restored leave markers out too).
func condenseAt(ed *editor, i int, id string, keep, visible map[string]bool) int {
	m := &ed.msgs[i]
	if m.CondenseParent != "" || keep[m.ID] {
		return 0
	}
	ed.tagAt(i, schema.TagCondenseParent, id)
	if visible[m.ID] && !m.IsTruncationMarker {
		return 1
	}
	return 0
}
