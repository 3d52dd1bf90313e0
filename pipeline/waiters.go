package pipeline

import "sync"

// waiters lets a history query wait until an input id is committed (wait_for).
type waiters struct {
	mu sync.Mutex
	m  map[string][]chan struct{}
}

func newWaiters() *waiters { return &waiters{m: map[string][]chan struct{}{}} }

// wait returns a channel closed when id is committed, and a cancel func.
func (w *waiters) wait(id string) (<-chan struct{}, func()) {
	ch := make(chan struct{})
	w.mu.Lock()
	w.m[id] = append(w.m[id], ch)
	w.mu.Unlock()
	return ch, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		list := w.m[id]
		for i, c := range list {
			if c == ch {
				w.m[id] = append(list[:i], list[i+1:]...)
				break
			}
		}
		if len(w.m[id]) == 0 {
			delete(w.m, id)
		}
	}
}

// done wakes every waiter of the ids.
func (w *waiters) done(ids []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.m) == 0 {
		return
	}
	for _, id := range ids {
		for _, ch := range w.m[id] {
			close(ch)
		}
		delete(w.m, id)
	}
}
