package proxy

// verdict is how a request's turns relate to a conversation's recorded ones.
type verdict int

const (
	// extends: the recorded turns are a prefix of the request's; the rest
	// are new.
	extends verdict = iota
	// retried: the request's turns are a strict prefix of the recorded
	// ones: a request sent again after its reply was recorded.
	retried
	// diverged: the request no longer extends the recorded history (the
	// client compacted it, or edited an earlier message).
	diverged
)

func (v verdict) String() string {
	switch v {
	case extends:
		return "extends"
	case retried:
		return "retried"
	}
	return "diverged"
}

// matchTurns compares the ids of the recorded agent turns, in order, with
// the ids the request's turns get at the same positions. at is where the
// new turns start (extends), where the request ends (retried), or the
// first position that differs (diverged).
func matchTurns(recorded, request []string) (v verdict, at int) {
	n := min(len(recorded), len(request))
	for i := range n {
		if recorded[i] != request[i] {
			return diverged, i
		}
	}
	if len(recorded) > len(request) {
		return retried, len(request)
	}
	return extends, len(recorded)
}
