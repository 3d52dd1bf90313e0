package pipeline

import "sync"

// replays remembers, per partition, the inputs a term start read again
// (replay) and committed. The consumer's own delivery of such an input
// reaches this instance too when it was in the pull that started the term:
// a term replays everything the consumer delivered and nobody acked, and
// that includes the rest of the iterator's batch. That copy is the same
// stream message, committed already: it is acked without being decoded,
// looked up and found a duplicate (a quarter of the inputs of a cold start
// were prepared twice). Both copies are of one conversation, so the lane
// handles the replayed one first.
type replays struct {
	mu   sync.Mutex
	done map[int]map[uint64]struct{} // partition → stream sequences
}

func newReplays() *replays { return &replays{done: map[int]map[uint64]struct{}{}} }

// reset forgets partition p's replayed inputs: a new term replays again
// what is unacked then.
func (r *replays) reset(p int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.done, p)
}

// committed records that partition p's replayed input seq is committed.
func (r *replays) committed(p int, seq uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.done[p]
	if m == nil {
		m = map[uint64]struct{}{}
		r.done[p] = m
	}
	m[seq] = struct{}{}
}

// take tells whether partition p's input seq was replayed and committed,
// and forgets it: its delivered copy comes once.
func (r *replays) take(p int, seq uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.done[p][seq]; !ok {
		return false
	}
	delete(r.done[p], seq)
	return true
}
