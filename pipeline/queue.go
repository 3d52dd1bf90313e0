package pipeline

import "sync"

// laneQueue is a lane's FIFO of fetched inputs. It never blocks the
// dispatcher: one conversation with a long backlog must not stop the
// dispatcher from feeding the other lanes. Its size is bounded anyway, by
// the consumer's MaxAckPending: the server sends no more unacked inputs.
type laneQueue struct {
	mu     sync.Mutex
	items  []*job
	ready  chan struct{} // holds a token while items is not empty or closed
	closed bool
}

func newLaneQueue() *laneQueue { return &laneQueue{ready: make(chan struct{}, 1)} }

func (q *laneQueue) push(j *job) {
	q.mu.Lock()
	q.items = append(q.items, j)
	q.mu.Unlock()
	q.signal()
}

func (q *laneQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.signal()
}

func (q *laneQueue) signal() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// pop waits for inputs and returns up to max of them, oldest first. It
// returns nil once the queue is closed and empty.
func (q *laneQueue) pop(max int) []*job {
	for {
		q.mu.Lock()
		if n := min(len(q.items), max); n > 0 {
			out := make([]*job, n)
			copy(out, q.items)
			q.items = q.items[n:]
			if len(q.items) == 0 {
				q.items = nil // let the backing array go
			} else {
				defer q.signal()
			}
			q.mu.Unlock()
			return out
		}
		if q.closed {
			q.mu.Unlock()
			q.signal() // wake any other waiter to see the close
			return nil
		}
		q.mu.Unlock()
		<-q.ready
	}
}
