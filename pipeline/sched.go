package pipeline

import "sync"

// scheduler hands conversations to workers. Each conversation has its own
// FIFO of fetched inputs and is held by at most one worker at a time, so its
// inputs are applied one after another in stream order; any other
// conversation with inputs waiting is free for the next idle worker. A
// conversation waiting on its summarizer therefore delays only itself: no
// lane shared with other conversations sits behind it.
//
// The scheduler never blocks the dispatcher. Its size is bounded by the
// consumer's MaxAckPending and the runner's held-bytes bound.
type scheduler struct {
	mu     sync.Mutex
	cond   *sync.Cond
	convs  map[string]*convQueue
	ready  []string // conversations with inputs waiting and no worker, oldest first
	closed bool
}

type convQueue struct {
	items []*job
	busy  bool // a worker holds the conversation
	ready bool // the conversation is in scheduler.ready
}

func newScheduler() *scheduler {
	s := &scheduler{convs: map[string]*convQueue{}}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// push queues a fetched input behind its conversation's earlier ones.
func (s *scheduler) push(j *job) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.convs[j.conv]
	if q == nil {
		q = &convQueue{}
		s.convs[j.conv] = q
	}
	q.items = append(q.items, j)
	if !q.busy && !q.ready {
		q.ready = true
		s.ready = append(s.ready, j.conv)
		s.cond.Signal()
	}
}

// take waits for a conversation no worker holds and returns up to max of its
// inputs, oldest first; the caller holds the conversation until it calls
// release. take returns nil once the scheduler is closed and nothing is
// waiting.
func (s *scheduler) take(max int) (string, []*job) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.ready) == 0 {
		if s.closed {
			return "", nil
		}
		s.cond.Wait()
	}
	conv := s.ready[0]
	s.ready[0] = ""
	s.ready = s.ready[1:]
	if len(s.ready) == 0 {
		s.ready = nil // let the backing array go
	}
	q := s.convs[conv]
	q.ready, q.busy = false, true
	n := min(len(q.items), max)
	out := make([]*job, n)
	copy(out, q.items)
	clear(q.items[:n])
	q.items = q.items[n:]
	return conv, out
}

// release gives a conversation back after its inputs were acked or given
// back; inputs that arrived meanwhile make it ready again.
func (s *scheduler) release(conv string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.convs[conv]
	if q == nil {
		return
	}
	q.busy = false
	if len(q.items) == 0 {
		delete(s.convs, conv)
		return
	}
	q.ready = true
	s.ready = append(s.ready, conv)
	s.cond.Signal()
}

// close wakes every worker: they finish what is queued, then take returns nil.
func (s *scheduler) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cond.Broadcast()
}
