package pipeline

import (
	"context"
	"sync"
	"time"

	"github.com/ctxpipe/ctxpipe/schema"
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

// defaultWait is how long wait_for waits when the request names no timeout.
const defaultWait = 10 * time.Second

// waitFor returns once input id of conversation conv is committed, or an
// error on timeout or when the input was rejected. An id committed in
// another conversation does not count: an agent is never told its turn is
// there when it is not. The wait holds no store-read slot.
func (q *queryServer) waitFor(ctx context.Context, conv, id string, timeout time.Duration) error {
	answer := func(status store.Status, reason string) error {
		if status == store.StatusRejected {
			return schema.QueryErrorf(schema.QueryInputRejected, "input %s was rejected: %s", id, reason)
		}
		return nil
	}
	check := func() (bool, error) {
		defer readSlot(ctx)()
		status, reason, found, err := q.stores.ForKey(conv).InputStatusIn(ctx, conv, id)
		if err != nil || !found {
			return false, err
		}
		return true, answer(status, reason)
	}
	release, ok := waitSlot(ctx)
	if !ok {
		// No room to wait: answer only what the store holds already.
		if ok, err := check(); ok || err != nil {
			return err
		}
		return schema.QueryErrorf(schema.QueryTimeout, "too many waits pending; input %s was not awaited", id)
	}
	defer release()
	// Registered before the store is read, so a commit landing in between
	// is not missed; the store is read once, for an input committed before
	// this request came.
	ch, cancel := q.waiters.wait(id)
	defer func() { cancel() }()
	if ok, err := check(); ok || err != nil {
		return err
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case o := <-ch:
			switch {
			case o.known && o.conv == conv:
				return answer(o.status, o.reason)
			case !o.known:
				// A redelivery found stored already: the store says where.
				if ok, err := check(); ok || err != nil {
					return err
				}
			}
			// The id was committed elsewhere (another conversation's input
			// reusing it is rejected there): keep waiting for ours.
			cancel()
			ch, cancel = q.waiters.wait(id)
			if ok, err := check(); ok || err != nil {
				return err
			}
		case <-t.C:
			return schema.QueryErrorf(schema.QueryTimeout, "input %s was not applied within %v", id, timeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
