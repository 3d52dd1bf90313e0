package engine

import (
	"context"
	"errors"
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

// manage is manageContext: mask older tool results when the profile masks
// and the threshold is crossed, and stop there if that brought an automatic
// trigger back under it (afterMask); otherwise condense if the decision
// says so, check that the context shrank, and truncate when the condense
// did not apply and the context is over the allowed size. What MustKeep
// names survives each step.
func (r *run) manage(d Decision) error {
	masking := maskDue(r.p.Mask.Enabled, d)
	if !d.Condense && !d.Truncate && !masking {
		return nil
	}
	if err := r.load(); err != nil {
		return err
	}
	r.keep = MustKeep(r.hist, r.st.Pins, r.p)
	defer func() { r.st.Messages = len(r.hist) }()
	if masking && r.mask(d) && d.Trigger == schema.TriggerAuto {
		next, goOn := afterMask(r.decide(d.Trigger), r.p.AutoCondenseOr(r.e.Globals), r.st.CondenseBlocked)
		if !goOn {
			return nil
		}
		d = next
	}
	condensed := false
	if d.Condense {
		ok, err := r.condense(d)
		if err != nil {
			return err
		}
		condensed = ok
	}
	if !condensed && d.Truncate {
		r.truncate(d)
	}
	return nil
}

// mask runs observation masking and reports whether it masked anything. An
// automatic masking that would free less than the profile's minimum gain is
// not made: it would break the agent's prompt cache for little.
func (r *run) mask(d Decision) bool {
	before := effectiveTokens(r.st.SystemTokens, r.hist)
	o := MaskOptions{KeepLast: r.p.MaskKeepLast(), ExcludeTools: r.p.Mask.ExcludeTools, Keep: r.keep}
	m, ok := PlanMask(r.hist, o, DeriveID(InputScope(r.in), "mask"), r.in.TS, r.ctr.Content)
	if !ok {
		return false
	}
	next := effectiveTokens(r.st.SystemTokens, m.History)
	if !maskWorth(d.Trigger, before-next, r.p.MaskMinGain()) {
		r.log().Debug("masking skipped: too little gain", "gain", before-next, "min_gain", r.p.MaskMinGain())
		return false
	}
	r.merge(m.Changes, m.History)
	r.st.ContextTokens = next
	r.ch.Events = append(r.ch.Events, &schema.ToolResultsMasked{
		EventHeader:       r.header(schema.EventToolResultsMasked),
		MaskID:            m.MaskID,
		Count:             m.Count,
		MessagesMasked:    m.Messages,
		PrevContextTokens: d.Prev,
		NewContextTokens:  next,
		Trigger:           d.Trigger,
	})
	r.log().Info("masked tool results", "count", m.Count, "prev_tokens", d.Prev, "new_tokens", next)
	return true
}

func (r *run) condense(d Decision) (bool, error) {
	// The real context before, on the same footing as the recount after:
	// an overflow raises d.Prev to the window, and a provider's usage counts
	// what the local count does not (tool definitions) or less than it (the
	// fudge factor), so either would let a summary that grows the context
	// pass.
	before := effectiveTokens(r.st.SystemTokens, r.hist)
	plan, planErr := PlanCondenseWith(r.hist, r.p, InputScope(r.in), CondenseOptions{Keep: r.keep, Instructions: r.in.Instructions, MaskResults: r.p.Mask.Enabled})
	kept := keptTokens(r.st.SystemTokens, r.hist, r.keep)
	keptOver := keptOverAllowed(len(r.keep), kept, d.Allowed)
	if planErr == nil && !keptOver {
		// The most a condense can free is what it hides: its summary only adds.
		gain := before - effectiveTokens(r.st.SystemTokens, plan.Finish("", r.ctr.Content).History)
		if !condenseWorth(d.Trigger, gain, r.p.MinGain()) {
			r.log().Debug("condense skipped: too little gain", "gain", gain, "min_gain", r.p.MinGain())
			return false, nil
		}
	}
	r.announce(d)
	if err := planErr; err != nil {
		var se *schema.Error
		if errors.As(err, &se) {
			return r.condenseFailed(d, se.Reason, se.Message, 0), nil
		}
		return false, err
	}
	if keptOver {
		// What must stay verbatim is already over the allowed context: no
		// summary can bring it under. The truncation that follows keeps
		// those messages too, so the agent's next request may overflow;
		// unpinning is the way out.
		return r.condenseFailed(d, schema.ReasonPinnedOverWindow, fmt.Sprintf("the messages that must stay verbatim (pinned, the task, the latest instruction) make %d tokens; %d are allowed", kept, int(d.Allowed)), 0), nil
	}
	sum, err := r.e.Summarizer.Summarize(r.ctx, plan.Request)
	if cerr := r.ctx.Err(); cerr != nil {
		return false, cerr
	}
	if reason, msg, failed := summaryFailure(sum, err); failed {
		return r.condenseFailed(d, reason, msg, sum.Cost), nil
	}
	c := plan.Finish(sum.Text, r.ctr.Content)
	next := effectiveTokens(r.st.SystemTokens, c.History)
	if err := VerifyShrink(before, next); err != nil {
		return r.condenseFailed(d, schema.ReasonContextGrew, err.Error(), sum.Cost), nil
	}
	r.merge(c.Changes, c.History)
	r.st.ContextTokens = next
	r.st.Condensations++
	r.st.CondenseBlocked = false
	r.ch.Events = append(r.ch.Events, &schema.CondenseContext{
		EventHeader:       r.header(schema.EventCondenseContext),
		CondenseID:        plan.CondenseID,
		Summary:           sum.Text,
		Cost:              sum.Cost,
		PrevContextTokens: d.Prev,
		NewContextTokens:  next,
		MessagesCondensed: c.MessagesCondensed,
		Trigger:           d.Trigger,
		Model:             sum.Model,
		Strategy:          string(plan.Strategy),
		Instructions:      r.in.Instructions,
	})
	r.log().Info("condensed", "strategy", plan.Strategy, "trigger", d.Trigger, "prev_tokens", d.Prev, "new_tokens", next, "messages", c.MessagesCondensed)
	return true, nil
}

// announce records the context_managing event of a condense about to be
// tried and hands it to Progress, so a UI shows progress while the
// summarizer runs.
func (r *run) announce(d Decision) {
	managing := &schema.ContextManaging{
		EventHeader:   r.header(schema.EventContextManaging),
		Trigger:       d.Trigger,
		ContextTokens: d.Prev,
		ContextWindow: d.Window,
		Threshold:     d.Threshold,
	}
	r.ch.Events = append(r.ch.Events, managing)
	if r.e.Progress != nil {
		r.e.Progress(r.ctx, managing)
	}
}

// condenseFailed records a condense that failed for reason, with the
// latch it sets (latches), and reports that nothing was condensed.
func (r *run) condenseFailed(d Decision, reason schema.Reason, msg string, cost float64) bool {
	// A provider's error message is quoted: bounded, like every event's.
	msg = schema.Clip(msg, schema.MaxMessageBytes)
	r.ch.Events = append(r.ch.Events, &schema.CondenseFailed{
		EventHeader: r.header(schema.EventCondenseFailed),
		Error:       reason, Message: msg, Cost: cost, Trigger: d.Trigger,
	})
	if latches(d.Trigger, reason) {
		r.st.CondenseBlocked = true
	}
	r.log().Info("condense failed", "reason", reason, "detail", msg, "trigger", d.Trigger)
	return false
}

// VerifyShrink rejects a condense whose new context is not smaller than the
// old one (Roo's "context grew" check; Gemini's inflated-token check). Both
// are real counts of the same kind: never a count raised by an overflow.
func VerifyShrink(prev, next int) error {
	if next >= prev {
		return fmt.Errorf("context would grow or stay the same: %d tokens before, %d after", prev, next)
	}
	return nil
}

func (r *run) truncate(d Decision) {
	t, ok := PlanTruncationKeeping(r.hist, TruncateFraction, DeriveID(InputScope(r.in), "truncation"), r.keep, r.ctr.Content)
	if !ok {
		r.log().Warn("over the allowed context, but there is nothing left to truncate", "tokens", d.Prev, "allowed", d.Allowed)
		return
	}
	r.merge(t.Changes, t.History)
	next := effectiveTokens(r.st.SystemTokens, t.History)
	r.st.ContextTokens = next
	r.st.Truncations++
	r.ch.Events = append(r.ch.Events, &schema.SlidingWindowTruncation{
		EventHeader:       r.header(schema.EventSlidingWindowTruncation),
		TruncationID:      t.TruncationID,
		MessagesRemoved:   t.Removed,
		PrevContextTokens: d.Prev,
		NewContextTokens:  next,
	})
	r.log().Info("truncated", "messages", t.Removed, "prev_tokens", d.Prev, "new_tokens", next)
}

// nothingToReduce is the event that ends an overflow that reduced nothing
// (see EndUnreduced). Without it the agent, whose request the provider
// refused, would learn only from its next refusal that the context is as
// it was.
func (r *run) nothingToReduce(d Decision) *schema.CondenseFailed {
	why := "nothing is left to truncate"
	if !d.Condense { // a forced decision condenses unless blocked
		why = "condensing is blocked after a failed summary, and " + why
	}
	return &schema.CondenseFailed{
		EventHeader: r.header(schema.EventCondenseFailed),
		Error:       schema.ReasonNothingToReduce,
		Message:     fmt.Sprintf("%s: the context (%d tokens counted, %d allowed) stays as it is; unpin or rewind to get under the window", why, r.st.ContextTokens, int(d.Allowed)),
		Trigger:     d.Trigger,
	}
}

// reductionEvents are the events that say a reduction applied.
var reductionEvents = map[schema.EventType]bool{
	schema.EventCondenseContext:         true,
	schema.EventSlidingWindowTruncation: true,
	schema.EventToolResultsMasked:       true,
}

// EndUnreduced makes the outcome of a forced reduction explicit. evs are
// the events it emitted; when one of them is a reduction (a condense, a
// truncation, a masking) they are returned as they are. Otherwise the
// context is as it was, and the events must end in nothing (a
// condense_failed with nothing_to_reduce): an agent then knows that
// sending the same request again will overflow again. When a condense
// was tried and failed, its condense_failed becomes that event (one input
// emits one event of each type), with the condense's own reason kept in
// condense_error and its message and cost kept too; when none was tried
// (condensing is blocked), nothing is appended.
func EndUnreduced(evs []schema.Event, nothing *schema.CondenseFailed) []schema.Event {
	for _, e := range evs {
		if reductionEvents[e.Header().Type] {
			return evs
		}
	}
	for i, e := range evs {
		f, ok := e.(*schema.CondenseFailed)
		if !ok {
			continue
		}
		if f.Error == schema.ReasonNothingToReduce {
			return evs
		}
		ended := *nothing
		ended.EventHeader = f.EventHeader
		ended.CondenseError = f.Error
		ended.Cost = f.Cost
		ended.Message = schema.Clip(fmt.Sprintf("the condense failed (%s: %s), and %s", f.Error, f.Message, nothing.Message), schema.MaxMessageBytes)
		out := append(evs[:i:i], &ended)
		return append(out, evs[i+1:]...)
	}
	return append(evs, nothing)
}

func (r *run) rewind() error {
	msgs, err := r.h.Messages(r.ctx)
	if err != nil {
		return fmt.Errorf("load history of %s: %w", r.in.ConversationID, err)
	}
	evs, err := r.h.ContextEvents(r.ctx)
	if err != nil {
		return fmt.Errorf("load context events of %s: %w", r.in.ConversationID, err)
	}
	rw, ok := PlanRewind(msgs, evs, r.in.TS, r.in.IncludeTarget)
	if !ok {
		return schema.Errorf(schema.ReasonUnknownTarget, "nothing to rewind at or after ts %d", r.in.TS)
	}
	r.ch.Delete = rw.Changes.Delete
	r.ch.Tags = rw.Changes.Tags
	r.st.ContextTokens = effectiveTokens(r.st.SystemTokens, rw.History)
	r.st.Messages = len(rw.History)
	r.st.Condensations, r.st.Truncations = 0, 0
	for i := range rw.History {
		if rw.History[i].IsCondenseSummary() {
			r.st.Condensations++
		}
		if rw.History[i].IsTruncationMarker {
			r.st.Truncations++
		}
	}
	r.st.CondenseBlocked = false
	if len(r.st.Pins) > 0 {
		// A deleted message's pin goes with it.
		kept := idSet(rw.History)
		pins := map[string]bool{}
		for id, v := range r.st.Pins {
			if kept[id] {
				pins[id] = v
			}
		}
		r.st.Pins = pins
		if len(pins) == 0 {
			r.st.Pins = nil
		}
	}
	// The calls a result may answer come from the agent's turns as stored,
	// as they were when each turn was appended: a condense that hides the
	// last assistant turn does not close its calls.
	r.st.LastToolUseIDs = nil
	for i := range rw.History {
		if !rw.History[i].Synthetic() {
			r.st.LastToolUseIDs = nextToolUseIDs(r.st.LastToolUseIDs, &rw.History[i])
		}
	}
	r.st.LastTS = 0
	for i := range rw.History {
		r.st.LastTS = max(r.st.LastTS, rw.History[i].TS)
	}
	r.ch.Events = append(r.ch.Events, &schema.Rewind{
		EventHeader:          r.header(schema.EventRewind),
		CutoffTS:             r.in.TS,
		IncludeTarget:        r.in.IncludeTarget,
		RemovedCondenseIDs:   rw.RemovedCondenseIDs,
		RemovedTruncationIDs: rw.RemovedTruncationIDs,
		RemovedMaskIDs:       rw.RemovedMaskIDs,
		MessagesRemoved:      rw.MessagesRemoved,
		MessagesRestored:     rw.MessagesRestored,
	})
	return nil
}

// pin records a pin input's verdict on a stored message in the state. It
// changes no message: the store keeps bodies as sent, and the state is what
// every reduction reads. Pinning a message that is hidden already does not
// bring it back (a rewind does); it keeps the message from the reductions
// to come once it is visible.
func (r *run) pin() error {
	msgs, err := r.h.Messages(r.ctx)
	if err != nil {
		return fmt.Errorf("load history of %s: %w", r.in.ConversationID, err)
	}
	var target *schema.Message
	for i := range msgs {
		if msgs[i].ID == r.in.MessageID {
			target = &msgs[i]
			break
		}
	}
	if target == nil {
		return schema.Errorf(schema.ReasonUnknownTarget, "no stored message %q", r.in.MessageID)
	}
	id := target.ID
	if target.IsMask() {
		id = target.MaskOf // a stand-in follows its original
	}
	pins := make(map[string]bool, len(r.st.Pins)+1) // never write into the caller's map
	for k, v := range r.st.Pins {
		pins[k] = v
	}
	pins[id] = r.in.Pinned
	for i := range msgs {
		if msgs[i].ID == id && msgs[i].Pinned == r.in.Pinned {
			delete(pins, id) // the stored flag says it already
		}
	}
	if len(pins) > schema.MaxPins {
		return schema.Errorf(schema.ReasonTooLarge, "more than %d pin changes in one conversation", schema.MaxPins)
	}
	r.st.Pins = pins
	if len(pins) == 0 {
		r.st.Pins = nil
	}
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
