package engine

import (
	"strings"

	"github.com/ctxpipe/ctxpipe/schema"
)

// The rules of one reduction, as manage and its steps apply them: when a
// masking is due and worth making, when it is enough on its own, when a
// condense is worth trying, what a summarizer's answer means and when a
// failure blocks the next condenses. Each is a pure function of plain
// values; the run applies them and records the events.

// MaskStopFraction of the threshold is where masking alone must bring the
// context for an automatic reduction to stop there, without a condense. A
// keep_tail condense leaves about a quarter of the threshold on the shared
// agent runs (make quality); a masking that stopped higher would bring the
// next reduction, and the next broken prompt cache, sooner than a condense
// does. Below it no model is called at all.
const MaskStopFraction = 0.25

// maskDue reports whether a profile that masks (masks) masks older tool
// results on decision d: always on a manual or forced trigger, and on an
// automatic one when the threshold is reached or the context is over the
// allowed size.
func maskDue(masks bool, d Decision) bool {
	return masks && (d.Trigger != schema.TriggerAuto ||
		d.Percent >= float64(d.Threshold) || float64(d.Prev) > d.Allowed)
}

// maskWorth reports whether a masking that frees gain tokens is made: it
// must free something and, when automatic, at least minGain; less would
// break the agent's prompt cache for little.
func maskWorth(trig schema.Trigger, gain, minGain int) bool {
	return gain > 0 && (trig != schema.TriggerAuto || gain >= minGain)
}

// maskSuffices reports whether an automatic masking that brought the
// context to next (Decide over the masked history) is enough on its own:
// nothing is over the allowed size, and it leaves room for as long as a
// condense would (MaskStopFraction of the threshold). Masking cost no model
// call.
func maskSuffices(next Decision) bool {
	return !next.Truncate && next.Percent <= float64(next.Threshold)*MaskStopFraction
}

// afterMask is what an automatic reduction does once a masking applied;
// next is Decide over the masked history. It stops there (goOn false) when
// the masking suffices, or when the context is under the threshold and
// auto-condense is off or blocked. Otherwise it goes on with next, which
// condenses even under the threshold: the condense runs now, on the masked
// history, so the agent's prompt cache breaks once, not twice in a few
// turns.
func afterMask(next Decision, autoCondense, blocked bool) (d Decision, goOn bool) {
	if maskSuffices(next) {
		return next, false
	}
	if !next.Condense && !next.Truncate {
		// Under the threshold but short of the target.
		next.Condense = autoCondense && !blocked
		if !next.Condense {
			return next, false
		}
	}
	return next, true
}

// condenseWorth reports whether a condense that can free at most gain
// tokens (what it hides: its summary only adds) is tried. An automatic one
// below minGain is worth neither the model call nor the agent's broken
// prompt cache; a manual or forced one is always tried.
func condenseWorth(trig schema.Trigger, gain, minGain int) bool {
	return trig != schema.TriggerAuto || gain >= minGain
}

// keptOverAllowed reports whether the kept tokens of what must stay
// verbatim (keep messages of it; none means no constraint) are already over
// the allowed context: then no summary can bring the context under it.
func keptOverAllowed(keep, kept int, allowed float64) bool {
	return keep > 0 && allowed > 0 && float64(kept) > allowed
}

// summaryFailure is what a summarizer's answer means for the condense:
// failed with llm_error for an error (empty_summary for one that says so),
// failed with empty_summary for a blank text, and not failed otherwise.
// msg is the failure's detail.
func summaryFailure(sum schema.Summary, err error) (reason schema.Reason, msg string, failed bool) {
	if err != nil {
		if schema.ReasonOf(err) == schema.ReasonEmptySummary {
			return schema.ReasonEmptySummary, err.Error(), true
		}
		return schema.ReasonLLMError, err.Error(), true
	}
	if strings.TrimSpace(sum.Text) == "" {
		return schema.ReasonEmptySummary, "the summarizer returned no text", true
	}
	return "", "", false
}

// latches tells whether a condense on trig that failed for reason blocks
// the next automatic and forced ones (Gemini's latch): only an automatic or
// forced one whose summarizer was asked and whose work was no good, since
// asking again on every turn would cost a model call each time for the same
// result. A refusal made before any call (too few messages yet, a summary
// too recent, pinned messages over the window) costs nothing to decide
// again, and the next turns may well change it: Roo decides again on every
// turn. A manual condense never latches.
func latches(trig schema.Trigger, reason schema.Reason) bool {
	if trig == schema.TriggerManual {
		return false
	}
	switch reason {
	case schema.ReasonLLMError, schema.ReasonEmptySummary, schema.ReasonContextGrew:
		return true
	}
	return false
}
