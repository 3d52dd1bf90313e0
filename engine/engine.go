package engine

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/tokens"
)

// Summarizer writes a summary of a conversation (an LLM, or the offline
// extractive condenser). A returned error is an outcome (condense_failed with
// llm_error, or with the reason of a *schema.Error it wraps, such as
// empty_summary) unless ctx is done. With an error, the Summary may still
// carry the cost of a reply that was paid for.
type Summarizer interface {
	Summarize(ctx context.Context, req schema.SummaryRequest) (schema.Summary, error)
}

// History gives the engine a conversation's stored history when a decision
// needs it. The engine asks only when it condenses, truncates or rewinds, so
// a turn that needs no action costs O(1) whatever the history's length.
type History interface {
	// Messages is the full stored history, hidden messages included, in order.
	Messages(ctx context.Context) ([]schema.Message, error)
	// ContextEvents are the conversation's condense and truncation events.
	ContextEvents(ctx context.Context) ([]schema.ContextEventRef, error)
}

// Engine turns one input into the Changes it causes. The zero value is not
// usable: set Summarizer.
type Engine struct {
	Summarizer Summarizer
	Globals    schema.Globals
	Log        *slog.Logger
	// Progress, when set, receives the context_managing event before the
	// summarizer is called, so a UI can show progress while it runs. The
	// event is in the returned Changes too (it has the same id).
	Progress func(ctx context.Context, ev schema.Event)
	// Counter picks a profile's counter; tokens.ForProfile when nil.
	Counter func(p *schema.Profile) (tokens.Counter, error)
}

// SummarizerFunc adapts a function to a Summarizer.
type SummarizerFunc func(ctx context.Context, req schema.SummaryRequest) (schema.Summary, error)

// Summarize calls f.
func (f SummarizerFunc) Summarize(ctx context.Context, req schema.SummaryRequest) (schema.Summary, error) {
	return f(ctx, req)
}

// NewEngine returns an engine with Roo's global defaults.
func NewEngine(s Summarizer) *Engine {
	return &Engine{Summarizer: s, Globals: schema.DefaultGlobals(), Log: slog.Default()}
}

// Apply runs the stages for one input: count, threshold, condense, verify,
// truncate. st is the conversation's state before the input (zero for a new
// conversation). A returned *schema.Error means the input is rejected (for
// example orphan_tool_result); any other error is transient or ctx's.
// Domain failures, such as a condense that did not shrink the context, are
// events in the returned Changes, not errors.
func (e *Engine) Apply(ctx context.Context, st schema.ConversationState, h History, p *schema.Profile, in schema.Input) (*schema.Changes, error) {
	counter := e.Counter
	if counter == nil {
		counter = tokens.ForProfile
	}
	ctr, err := counter(p)
	if err != nil {
		return nil, fmt.Errorf("token counter for profile %q: %w", p.ID, err)
	}
	st.ConversationID, st.ProfileID = in.ConversationID, p.ID
	if in.Kind != schema.KindTurn && st.Messages == 0 {
		// A control input must not bring a conversation into being: its
		// state (a blocked condense, say) would then weigh on a real
		// conversation that later uses the id.
		return nil, schema.Errorf(schema.ReasonUnknownConversation, "%s for conversation %q, which has no stored turn", in.Kind, in.ConversationID)
	}
	r := &run{e: e, ctx: ctx, in: in, p: p, ctr: ctr, st: st, h: h}
	switch in.Kind {
	case schema.KindTurn:
		err = r.turn()
	case schema.KindCondense:
		err = r.manage(r.decide(schema.TriggerManual))
	case schema.KindOverflow:
		d := r.decide(schema.TriggerForced)
		if err = r.manage(d); err == nil {
			r.ch.Events = EndUnreduced(r.ch.Events, r.nothingToReduce(d))
		}
	case schema.KindRewind:
		err = r.rewind()
	case schema.KindPin:
		err = r.pin()
	default:
		err = schema.Errorf(schema.ReasonUnknownKind, "unknown input kind %q", in.Kind)
	}
	if err != nil {
		return nil, err
	}
	r.ch.State = r.st
	r.ch.Tags = foldTags(r.ch.Insert, r.ch.Tags)
	return &r.ch, nil
}

// run is one Apply call's working state.
type run struct {
	e   *Engine
	ctx context.Context
	in  schema.Input
	p   *schema.Profile
	ctr tokens.Counter
	st  schema.ConversationState
	h   History
	ch  schema.Changes
	// hist is the full history as it will be after ch, once loaded.
	hist    []schema.Message
	loaded  bool
	pending *schema.Message // the new turn, not yet in the store
	keep    map[string]bool // MustKeep over hist, once loaded
}

func (r *run) turn() error {
	t := r.in.Turn
	if t.Role == schema.RoleUser {
		for _, b := range t.Content.Blocks {
			if b.Type == schema.BlockToolResult && !contains(r.st.LastToolUseIDs, b.ToolUseID) {
				return schema.Errorf(schema.ReasonOrphanToolResult, "tool_result %q answers no tool_use of the previous assistant turn", b.ToolUseID)
			}
		}
	}
	msg := schema.Message{Turn: *t, Tokens: r.ctr.Content(t.Content)}
	if t.SystemPrompt != "" && t.SystemPrompt != r.st.SystemPrompt {
		n := r.ctr.String(t.SystemPrompt)
		r.st.ContextTokens += n - r.st.SystemTokens
		r.st.SystemPrompt, r.st.SystemTokens = t.SystemPrompt, n
	}
	if t.Usage != nil {
		r.st.ContextTokens = t.Usage.Total()
	} else {
		r.st.ContextTokens += msg.Tokens
	}
	r.st.LastToolUseIDs = nextToolUseIDs(r.st.LastToolUseIDs, &msg)
	r.st.Messages++
	r.st.LastTS = max(r.st.LastTS, t.TS)
	r.ch.Insert = append(r.ch.Insert, schema.Insertion{Message: msg})
	r.pending = &r.ch.Insert[len(r.ch.Insert)-1].Message
	if t.ContinuesFrom != "" && r.st.ContinuesFrom == "" {
		// The link is the conversation's from its first mention on; a later
		// turn naming another changes nothing (its own field stays stored).
		r.st.ContinuesFrom = t.ContinuesFrom
		r.ch.Events = append(r.ch.Events, &schema.ConversationForked{
			EventHeader: r.header(schema.EventConversationForked), ContinuesFrom: t.ContinuesFrom})
	}
	if awaitingResults(r.st.LastToolUseIDs, t) {
		// The agent calls its model only once every result is in, and
		// context is managed before that call (as Roo does). Reducing now
		// would summarize half an exchange, and the results would grow the
		// context again right after: wait for them.
		return nil
	}
	return r.manage(r.decide(schema.TriggerAuto))
}

// decide is Decide over the run's state, warning of a profile threshold
// it had to ignore.
func (r *run) decide(trig schema.Trigger) Decision {
	d := Decide(r.st.ContextTokens, r.p, r.e.Globals, trig, r.st.CondenseBlocked)
	if d.ThresholdIgnored && r.e.Log != nil {
		r.e.Log.Warn("invalid profile condense threshold; using the global percent",
			"profile", r.p.ID, "threshold", *r.p.CondenseThreshold, "global", d.Threshold)
	}
	return d
}

// load reads the stored history once, with the pending turn appended.
func (r *run) load() error {
	if r.loaded {
		return nil
	}
	msgs, err := r.h.Messages(r.ctx)
	if err != nil {
		return fmt.Errorf("load history of %s: %w", r.in.ConversationID, err)
	}
	if r.pending != nil {
		// Full slice expression: never write into the caller's spare capacity.
		msgs = append(msgs[:len(msgs):len(msgs)], *r.pending)
	}
	r.hist, r.loaded = msgs, true
	return nil
}

// merge adds a planner's changes (made over r.hist) and adopts its history.
func (r *run) merge(ch schema.Changes, hist []schema.Message) {
	r.ch.Insert = append(r.ch.Insert, ch.Insert...)
	r.ch.Tags = append(r.ch.Tags, ch.Tags...)
	r.hist = hist
	if r.pending != nil {
		r.pending = &r.ch.Insert[0].Message // append may have moved it
	}
}

func (r *run) header(t schema.EventType) schema.EventHeader {
	return schema.EventHeader{
		ID:             DeriveID(InputScope(r.in), "event/"+string(t)),
		Type:           t,
		ConversationID: r.in.ConversationID,
		TS:             r.in.TS,
		InputID:        r.in.ID,
	}
}

func (r *run) log() *slog.Logger {
	l := r.e.Log
	if l == nil {
		l = slog.Default()
	}
	return l.With("conv", r.in.ConversationID, "input_id", r.in.ID)
}

// foldTags moves tag changes aimed at messages inserted by the same Changes
// into those messages, so a store never applies a tag before its insert.
func foldTags(ins []schema.Insertion, tags []schema.TagChange) []schema.TagChange {
	if len(ins) == 0 || len(tags) == 0 {
		return tags
	}
	at := make(map[string]int, len(ins))
	for i := range ins {
		at[ins[i].Message.ID] = i
	}
	out := tags[:0:0]
	for _, t := range tags {
		i, ok := at[t.MessageID]
		if !ok {
			out = append(out, t)
			continue
		}
		if t.Field == schema.TagCondenseParent {
			ins[i].Message.CondenseParent = t.Value
		} else {
			ins[i].Message.TruncationParent = t.Value
		}
	}
	return out
}

// awaitingResults reports whether turn t leaves an exchange half done: open
// are the calls still unanswered after t, and t is the assistant turn that
// made them or a user turn that answered only some (OpenAI-style agents send
// one result turn per call). A user turn that answers none ends the wait:
// the agent moved on, so one exchange defers a reduction by at most as many
// turns as it has calls.
func awaitingResults(open []string, t *schema.Turn) bool {
	if len(open) == 0 {
		return false
	}
	return t.Role == schema.RoleAssistant || t.Content.HasBlock(schema.BlockToolResult)
}

// nextToolUseIDs tracks the tool calls a following tool_result may answer:
// an assistant turn opens its calls, a user turn closes the ones it answers.
func nextToolUseIDs(open []string, m *schema.Message) []string {
	if m.Role == schema.RoleAssistant {
		var ids []string
		for _, b := range m.Content.Blocks {
			if b.Type == schema.BlockToolUse {
				ids = append(ids, b.ID)
			}
		}
		return ids
	}
	if len(open) == 0 {
		return open
	}
	var still []string
	for _, id := range open {
		answered := false
		for _, b := range m.Content.Blocks {
			if b.Type == schema.BlockToolResult && b.ToolUseID == id {
				answered = true
				break
			}
		}
		if !answered {
			still = append(still, id)
		}
	}
	return still
}

func contains(ids []string, id string) bool {
	for _, v := range ids {
		if v == id {
			return true
		}
	}
	return false
}
