package changelog

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
)

// stallAfter is how long a follower may wait for its next message while
// the stream holds messages past the last one it got, before it gives up on
// its ordered consumer. After a node loss, the library re-creates an
// ordered consumer by itself, quietly and without bound (10 s a try, with
// backoff), which can leave a follower a minute behind the stream and
// every owner waiting on it.
const stallAfter = 4 * time.Second

// watch is the follower's watchdog: it stops the iterator (through stop)
// when the follower, waiting, has gone stallAfter without the message the
// stream holds past the last it got (counted from when the watchdog first
// saw the stream ahead, not from the start of the wait), and Err then says
// so.
type watch struct {
	after time.Duration // stallAfter but in tests
	// subjects are the follower's, when it follows some partitions only:
	// the stream's last message may then be none of theirs.
	subjects []string
	mu       sync.Mutex
	last     uint64    // the last sequence delivered
	waiting  time.Time // since when Next waits; zero when not waiting
	received bool      // a message was delivered in this run
	err      error
}

// bounds is how long a follower must have waited (wait), and then have
// been seen behind the stream (confirm), before it is stalled. A run that
// has received nothing yet, and was behind when first checked, is given
// less: the library creates its ordered consumer with a request that,
// after a node loss, can go unanswered for its whole 10 s timeout before it
// is sent again, while a healthy consumer delivers the first message of a
// backlog in milliseconds. A run that started at the
// stream's end and waited there is not: a message appended later may be
// large, and on its way.
func (w *watch) bounds(received, behindFromStart bool) (wait, confirm time.Duration) {
	switch {
	case received:
		return w.after, w.after
	case behindFromStart:
		return w.after / 2, w.after / 4
	default:
		return w.after / 2, w.after
	}
}

// behind is what the watchdog saw last: since when the stream has held a
// message past last while the follower waited. A wait that began in an
// idle spell says nothing about how long a new message has been waiting
// for delivery: only this does.
type behind struct {
	since time.Time
	last  uint64
}

func (w *watch) wait() {
	w.mu.Lock()
	w.waiting = time.Now()
	w.mu.Unlock()
}

func (w *watch) got(seq uint64) {
	w.mu.Lock()
	w.last, w.waiting, w.received = seq, time.Time{}, true
	w.mu.Unlock()
}

// Err is set once the watchdog stopped the iterator.
func (w *watch) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

func (w *watch) run(ctx context.Context, stream jetstream.Stream, stop func()) {
	t := time.NewTicker(w.after / 4)
	defer t.Stop()
	var b behind
	// quiet is the stream's end at which lastOf last found nothing of the
	// watched subjects past quietLast: while the stream stays there, a
	// request per subject a tick (an idle instance holding 32 partitions
	// made 33 requests a second) would only say so again.
	var quiet, quietLast uint64
	// checked is set at the run's first check of the stream, and
	// behindFromStart when that check found it behind while nothing was
	// received (see bounds).
	checked, behindFromStart := false, false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.mu.Lock()
		since, last, received := w.waiting, w.last, w.received
		w.mu.Unlock()
		wait, _ := w.bounds(received, behindFromStart)
		if since.IsZero() || time.Since(since) < wait {
			b = behind{}
			continue
		}
		end, known := w.end(ctx, stream)
		if streamEnd := end; known && end > last && len(w.subjects) > 0 {
			if end == quiet && last == quietLast {
				end = last
			} else if sub, ok := w.lastOf(ctx, stream); ok {
				end = sub
				if end <= last {
					quiet, quietLast = streamEnd, last
				}
			}
			// When the server cannot tell the subjects' last message, the
			// stream's end stands for it: a follower that is only idle is
			// then started again (one new ordered consumer), while taking
			// "cannot tell" for "idle" would leave a stalled one stalled
			// for as long as the requests fail, which is when a node is
			// lost.
		}
		if !known {
			// Nor can it tell the stream's end: taken as behind, for the
			// same reason. The stream's own info fails while its leader is
			// elected after a node loss, which is when an ordered consumer
			// dies without a word; the follower is then stopped once that
			// has lasted the confirm bound, not only once a leader answers.
			end = last + 1
		}
		first := !checked
		checked = true
		if end <= last {
			b = behind{} // idle
			continue
		}
		if first && !received {
			behindFromStart = true
		}
		_, confirm := w.bounds(received, behindFromStart)
		if b.since.IsZero() || b.last != last {
			// First seen behind: the message may have just been appended
			// after a long idle wait, and be on its way.
			b = behind{since: time.Now(), last: last}
			continue
		}
		if time.Since(b.since) < confirm {
			continue
		}
		ahead := fmt.Sprintf("the stream holds up to %d", end)
		if !known {
			ahead = "the server cannot tell the stream's end"
		}
		w.mu.Lock()
		stalled := !w.waiting.IsZero() && w.last == last
		if stalled {
			w.err = fmt.Errorf("follow %s: no message for %v after %d while %s",
				bus.StreamState, time.Since(b.since).Round(time.Second), last, ahead)
		}
		w.mu.Unlock()
		if stalled {
			stop()
			return
		}
	}
}

// end is the stream's last sequence; known is false when the server
// cannot tell (the request failed or timed out).
func (w *watch) end(ctx context.Context, stream jetstream.Stream) (end uint64, known bool) {
	ictx, cancel := context.WithTimeout(ctx, max(w.after/2, time.Second))
	defer cancel()
	info, err := stream.Info(ictx)
	if err != nil {
		return 0, false
	}
	return info.State.LastSeq, true
}

// lastOf is the last sequence of the watched subjects (0: none holds a
// message); ok is false when the server cannot tell.
func (w *watch) lastOf(ctx context.Context, stream jetstream.Stream) (end uint64, ok bool) {
	for _, subj := range w.subjects {
		ictx, cancel := context.WithTimeout(ctx, max(w.after/2, time.Second))
		m, err := stream.GetLastMsgForSubject(ictx, subj)
		cancel()
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
		case err != nil:
			return 0, false
		default:
			end = max(end, m.Sequence)
		}
	}
	return end, true
}
