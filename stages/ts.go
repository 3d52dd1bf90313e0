package stages

import "math"

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

// justAfter is the timestamp just after ts, never past MaxInt64.
func justAfter(ts int64) int64 {
	if ts < math.MaxInt64 {
		return ts + 1
	}
	return ts
}
