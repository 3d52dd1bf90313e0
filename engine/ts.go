package engine

// A summary or marker takes a timestamp next to the message it stands
// beside, so that it sorts there and a rewind to that message's time treats
// it as that message's neighbour. Inputs may carry any ts from 1 to
// MaxInt64: at the ends the neighbour's own ts is taken instead, since a
// stored ts must stay positive and must not wrap around.

// justBefore is the timestamp just before ts, never below 1.
func justBefore(ts int64) int64 {
	if ts > 1 {
		return ts - 1
	}
	return 1
}

// A summary at the end of the history (fresh_start, or preserve_fraction
// compressing everything) takes the last message's own ts, not the next
// millisecond: the agent's next turn may carry that one, and a rewind to
// that turn would then delete the summary and undo a condense made before
// the turn (a review found it). Sharing the ts of the turn that caused the
// condense costs nothing: a rewind to that turn undoes what it caused
// anyway.
