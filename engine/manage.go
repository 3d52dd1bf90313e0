package engine

import (
	"errors"
	"fmt"

	"github.com/ctxpipe/ctxpipe/schema"
)

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
