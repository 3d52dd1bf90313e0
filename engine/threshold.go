package engine

import "github.com/ctxpipe/ctxpipe/schema"

// TokenBufferFraction of the window is kept free (Roo's TOKEN_BUFFER_PERCENTAGE).
const TokenBufferFraction = 0.1

// ForcedReductionPercent is the threshold an overflow condenses at (Roo's
// FORCED_CONTEXT_REDUCTION_PERCENT); a valid profile threshold overrides it.
const ForcedReductionPercent = 75

// Decision is the threshold stage's verdict for one input.
type Decision struct {
	Trigger   schema.Trigger
	Prev      int     // context tokens before any action
	Window    int     // the profile's context window
	Allowed   float64 // window × 0.9 − reserved
	Percent   float64 // 100 × prev / window
	Threshold int     // the effective threshold percent
	// Condense: try a condense now.
	Condense bool
	// Truncate: if no condense applies, hide half of the visible history.
	Truncate bool
	// ThresholdIgnored: the profile's condense_threshold is out of range,
	// and the global percent applies instead (the caller warns).
	ThresholdIgnored bool
}

// AllowedTokens is window × 0.9 − reserved, where reserved is max_tokens or 8192.
func AllowedTokens(p *schema.Profile) float64 {
	return float64(p.ContextWindow)*(1-TokenBufferFraction) - float64(p.ReservedTokens())
}

// Decide applies Roo's threshold rules. prev is the context size including the
// newest message. For TriggerAuto: condense when auto-condense is on and
// (percent ≥ threshold or prev > allowed); truncate when prev > allowed and
// the condense did not run or failed. TriggerManual always condenses and never
// truncates (Gemini's force=true). TriggerForced (the provider said the window
// was exceeded) counts the context as at least the whole window, condenses at
// threshold 75 even if auto-condense is off, and truncates if that fails.
// blocked is Gemini's latch: after a failed automatic condense, automatic and
// forced triggers only truncate until a condense succeeds or one is asked for.
func Decide(prev int, p *schema.Profile, g schema.Globals, trig schema.Trigger, blocked bool) Decision {
	d := Decision{Trigger: trig, Prev: prev, Window: p.ContextWindow, Allowed: AllowedTokens(p)}
	auto, global := p.AutoCondenseOr(g), g.AutoCondensePercent
	valid := true
	switch trig {
	case schema.TriggerManual:
		d.Threshold, valid = p.Threshold(global)
		d.ThresholdIgnored = !valid
		d.Percent = percent(prev, p.ContextWindow)
		d.Condense = true
		return d
	case schema.TriggerForced:
		d.Prev = max(prev, p.ContextWindow)
		auto, global = true, ForcedReductionPercent
	}
	d.Percent = percent(d.Prev, p.ContextWindow)
	d.Threshold, valid = p.Threshold(global)
	d.ThresholdIgnored = !valid
	over := float64(d.Prev) > d.Allowed
	d.Condense = auto && !blocked && (d.Percent >= float64(d.Threshold) || over)
	d.Truncate = over
	return d
}

// WillManage reports whether Decide would act, for progress indicators (Roo's
// willManageContext): a condense when auto-condense is on and the threshold
// is reached, or a truncation when the context is over the allowed size.
func WillManage(prev int, p *schema.Profile, g schema.Globals) bool {
	d := Decide(prev, p, g, schema.TriggerAuto, false)
	return d.Condense || d.Truncate
}

func percent(tokens, window int) float64 {
	if window <= 0 {
		return 0
	}
	return 100 * float64(tokens) / float64(window)
}
