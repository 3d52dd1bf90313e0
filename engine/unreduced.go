package engine

import (
	"fmt"

	"github.com/ctxpipe/ctxpipe/schema"
)

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
