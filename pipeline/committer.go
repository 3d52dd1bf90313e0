package pipeline

import (
	"context"
	"fmt"
	"time"

	"github.com/ctxpipe/ctxpipe/store"
)

// commitReq is one worker's batch waiting to be committed.
type commitReq struct {
	entries []store.Entry
	done    chan error
}

// commit hands entries to the committer and waits for the transaction that
// holds them. Lanes ack only after this returns nil.
func (r *Runner) commit(entries []store.Entry) error {
	if len(entries) == 0 {
		return nil
	}
	req := &commitReq{entries: entries, done: make(chan error, 1)}
	r.commits <- req
	return <-req.done
}

// committer groups the batches of all workers that are waiting into one
// transaction: with synchronous=FULL each transaction costs an fsync, so one
// fsync for many inputs is what makes durable acks cheap.
func (r *Runner) committer() {
	for req := range r.commits {
		reqs, n := []*commitReq{req}, len(req.entries)
	gather:
		for n < r.cfg.MaxBatch {
			select {
			case x, ok := <-r.commits:
				if !ok {
					break gather
				}
				reqs = append(reqs, x)
				n += len(x.entries)
			default:
				break gather
			}
		}
		all := make([]store.Entry, 0, n)
		for _, x := range reqs {
			all = append(all, x.entries...)
		}
		err := r.commitEntries(all)
		for _, x := range reqs {
			if err != nil && len(reqs) > 1 {
				// One worker's entry may be at fault: commit each batch alone
				// so the others are not held back by it.
				x.done <- r.commitEntries(x.entries)
				continue
			}
			x.done <- err
		}
	}
}

func (r *Runner) commitEntries(entries []store.Entry) error {
	t0 := time.Now()
	// A commit is short and must not be cut off halfway by shutdown: it
	// runs on its own context.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	results, err := r.Store.Commit(ctx, entries)
	if err != nil {
		return fmt.Errorf("commit %d inputs: %w", len(entries), err)
	}
	r.Metrics.Inc("ctxpipe_commits_total", "")
	r.Metrics.Observe("ctxpipe_commit_seconds", "", time.Since(t0))
	ids := make([]string, len(entries))
	for i, e := range entries {
		ids[i] = e.Input.ID
		switch {
		case results[i].Duplicate:
			r.Metrics.Inc("ctxpipe_inputs_total", `outcome="duplicate"`)
			continue
		case e.Input.Status == store.StatusRejected:
			r.Metrics.Inc("ctxpipe_inputs_total", `outcome="rejected"`)
		default:
			r.Metrics.Inc("ctxpipe_inputs_total", `outcome="applied"`)
		}
		if e.Changes != nil {
			for _, ev := range e.Changes.Events {
				r.Metrics.Inc("ctxpipe_events_total", fmt.Sprintf(`type=%q`, ev.Header().Type))
			}
		}
	}
	if r.Relay != nil {
		r.Relay.Notify()
	}
	r.waiters.done(ids)
	return nil
}
