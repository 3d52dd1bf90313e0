package pipeline

import (
	"sync"

	"github.com/ctxpipe/ctxpipe/store"
)

// outcome is what a commit stored for an input id: where, and whether it
// was applied or rejected. known is false when the commit found the id
// stored already (a duplicate): what it holds then is the store's to say.
type outcome struct {
	conv   string // the conversation's key
	status store.Status
	reason string
	known  bool
}

// waiters lets a history query wait until an input id is committed
// (wait_for). A waiter gets the commit's outcome, so that it need not read
// the store again to learn it.
type waiters struct {
	mu sync.Mutex
	m  map[string][]chan outcome
}

func newWaiters() *waiters { return &waiters{m: map[string][]chan outcome{}} }

// wait returns a channel that receives id's outcome when it is committed,
// and a cancel func.
func (w *waiters) wait(id string) (<-chan outcome, func()) {
	ch := make(chan outcome, 1)
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

// done hands every waiter of the ids their outcome (outs[i] is ids[i]'s).
func (w *waiters) done(ids []string, outs []outcome) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.m) == 0 {
		return
	}
	for i, id := range ids {
		for _, ch := range w.m[id] {
			ch <- outs[i] // buffered, and each channel is sent to once
		}
		delete(w.m, id)
	}
}
