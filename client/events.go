package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/ctxpipe/ctxpipe/internal/backoff"
	"github.com/ctxpipe/ctxpipe/schema"
)

// RawEvent is an event of a type this client does not know (a newer service
// may add types); Data is its JSON as sent.
type RawEvent struct {
	schema.EventHeader
	Data json.RawMessage
}

// EventsOption shapes an event stream.
type EventsOption func(*eventsConfig)

type eventsConfig struct {
	replay   bool
	after    int
	progress bool
}

// Replay starts the stream with the conversation's stored events, oldest
// first, skipping the first after (0: from the very first), read through
// ctx.q.events (which works in a tenant's account, where CTX_EVENTS cannot
// be read), and goes on with the live ones without a gap or a duplicate.
// With Replay the stream also reads back from the service whatever it
// missed while the connection was down.
func Replay(after int) EventsOption {
	return func(e *eventsConfig) { e.replay, e.after = true, max(after, 0) }
}

// WithProgress also delivers each context_managing event the moment its
// condense starts (ctx.progress), while the summarizer runs, instead of when
// the condense commits: a UI can show "condensing…" at once. The committed
// copy (same id) is then not delivered again, so the event may come before
// events committed earlier; and a condense that a crash undid may have been
// announced.
func WithProgress() EventsOption { return func(e *eventsConfig) { e.progress = true } }

// EventStream delivers one conversation's events. Read C until it is
// closed; Err then says why it ended.
type EventStream struct {
	c      chan schema.Event
	cancel context.CancelFunc
	done   chan struct{}
	err    error // set before c is closed
}

// C delivers the events: each once, in commit order (see WithProgress for
// the one exception). Events are queued in memory until read, and the
// stream remembers the id of each it delivered (to drop the copies a relay
// retry or a replay overlap brings): tens of bytes an event.
func (s *EventStream) C() <-chan schema.Event { return s.c }

// Err is why the stream ended, once C is closed: nil after Close, ctx's
// error when the context ended, else the failure (a replay query the
// service refused, the connection closed). A replay query that finds the
// service away (no responders, internal, a reply lost with the connection)
// is asked again after a pause instead: a service restart does not end
// the stream.
func (s *EventStream) Err() error {
	select {
	case <-s.done:
		return s.err
	default:
		return nil
	}
}

// Close ends the stream and waits until C is closed.
func (s *EventStream) Close() {
	s.cancel()
	<-s.done
}

// errClosed is the cause of a stream its owner closed.
var errClosed = errors.New("event stream closed")

// Events streams conv's events: live ones from the moment Events returns
// (a core subscription on ctx.events.<conv>.*), and with Replay the stored
// ones first. Live events are subscribed before the replay is read and
// matched by event id, so nothing committed in between is lost or
// delivered twice. A conversation with no events yet (or none at all) is
// not an error: its events arrive when it gets some.
//
// Without Replay, events published while the connection is down are
// missed; with it, they are read back from the service after the
// reconnect.
func (c *Client) Events(ctx context.Context, conv string, opts ...EventsOption) (*EventStream, error) {
	if err := badConversation(schema.VerbEvents, conv); err != nil {
		return nil, err
	}
	var cfg eventsConfig
	for _, o := range opts {
		o(&cfg)
	}
	q := &eventQueue{ready: make(chan struct{}, 1)}
	var subs []*nats.Subscription
	unsubscribe := func() {
		for _, s := range subs {
			_ = s.Unsubscribe() // fails only on a closed connection, where it is gone anyway
		}
	}
	// An event type is one token: ".>" would also match the subjects of
	// tenant <conv>'s conversations (ctx.events.<tenant>.<conv>.<type>), so
	// that in the service's own account conversation "acme" would receive
	// tenant acme's events (and count them into its position).
	subjects := []string{schema.EventSubjectPrefix + c.scoped(conv) + ".*"}
	if cfg.progress {
		subjects = append(subjects, schema.ProgressSubjectPrefix+c.scoped(conv)+".*")
	}
	for i, subj := range subjects {
		progress := i == 1
		sub, err := c.nc.Subscribe(subj, func(m *nats.Msg) { q.push(m.Data, progress, c.epoch()) })
		if err != nil {
			unsubscribe()
			return nil, fmt.Errorf("ctxpipe events %s: subscribe %s: %w", conv, subj, err)
		}
		// The handler only queues, so the subscription never falls behind
		// and drops; the queue holds what the reader has not taken yet.
		_ = sub.SetPendingLimits(-1, -1)
		subs = append(subs, sub)
	}
	status := c.nc.StatusChanged(nats.CONNECTED, nats.CLOSED)
	// The subscriptions must be in place at the server before the replay
	// reads: then every event is in the replay or arrives live (or both).
	fctx, fcancel := c.bound(ctx, 0)
	err := c.nc.FlushWithContext(fctx)
	fcancel()
	if err == nil {
		// A subscription the server refuses fails only asynchronously; its
		// -ERR comes before the flush's PONG, so it is known by now.
		err = refused(c.nc, subjects)
	}
	if err != nil {
		unsubscribe()
		c.nc.RemoveStatusListener(status)
		return nil, fmt.Errorf("ctxpipe events %s: %w", conv, err)
	}
	sctx, cancel := context.WithCancelCause(ctx)
	s := &EventStream{c: make(chan schema.Event), cancel: func() { cancel(errClosed) }, done: make(chan struct{})}
	f := &follower{c: c, conv: conv, out: s.c, q: q, seen: map[string]bool{}, pos: -1}
	if cfg.replay {
		f.pos = cfg.after
	}
	go func() {
		err := f.run(sctx, status)
		unsubscribe()
		c.nc.RemoveStatusListener(status)
		if errors.Is(err, errClosed) || errors.Is(context.Cause(sctx), errClosed) {
			err = nil
		}
		s.err = err
		close(s.c)
		close(s.done)
	}()
	return s, nil
}

// refused returns the server's permissions violation for one of subjects,
// if the connection's last error is one.
func refused(nc *nats.Conn, subjects []string) error {
	err := nc.LastError()
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return nil
	}
	for _, s := range subjects {
		if strings.Contains(err.Error(), `Subscription to "`+s+`"`) {
			return err
		}
	}
	return nil
}

// eventQueue is an unbounded queue between the subscription handlers and
// the stream's goroutine.
type eventQueue struct {
	mu    sync.Mutex
	items []queued
	ready chan struct{} // signalled when items become non-empty
}

type queued struct {
	data     []byte
	progress bool
	// epoch is the connection's epoch when the message was handed to the
	// handler: at least the one it was received in.
	epoch uint64
}

func (q *eventQueue) push(data []byte, progress bool, epoch uint64) {
	q.mu.Lock()
	q.items = append(q.items, queued{data, progress, epoch})
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

func (q *eventQueue) take() []queued {
	q.mu.Lock()
	defer q.mu.Unlock()
	items := q.items
	q.items = nil
	return items
}

// follower merges the replay and the live events of one conversation.
type follower struct {
	c    *Client
	conv string
	out  chan<- schema.Event
	q    *eventQueue
	// seen holds every delivered event id: true once its committed copy
	// was seen (replayed or on ctx.events), false while only its progress
	// announcement was.
	seen map[string]bool
	// pos is how many of the conversation's committed events the stream
	// has accounted for, in commit order: where a catch-up reads from.
	// -1 without Replay: unknown, and no catch-up.
	pos int
	// epoch is the connection's epoch (see Client.epoch) that the last
	// catch-up started in. The subscriptions were at the server all through
	// it, so its live events follow pos without a gap and may be counted
	// into pos; a live event of a later epoch may come after a gap (events
	// published while the connection was down), so a catch-up comes first.
	epoch uint64
}

// epoch counts the connection's reconnects. It goes up before anything is
// received on the new connection, so a message handed to a handler in
// epoch e was received in e or earlier.
func (c *Client) epoch() uint64 { return c.nc.Stats().Reconnects }

func (f *follower) run(ctx context.Context, status chan nats.Status) error {
	if f.pos >= 0 {
		if err := f.catchUp(ctx); err != nil {
			return err
		}
	}
	for {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case st := <-status:
			// The channel drops a status when full (a reader that lagged
			// through many reconnects): ask the connection too.
			if st == nats.CLOSED || f.c.nc.IsClosed() {
				return fmt.Errorf("ctxpipe events %s: %w", f.conv, nats.ErrConnectionClosed)
			}
			// Back after a disconnect: what was published meanwhile never
			// reached the subscription; the service has it. (Live events
			// received since then may be queued already: they wait.)
			if f.pos >= 0 && f.c.epoch() != f.epoch {
				if err := f.catchUp(ctx); err != nil {
					return err
				}
			}
		case <-f.q.ready:
			for _, m := range f.q.take() {
				if err := f.live(ctx, m); err != nil {
					return err
				}
			}
		}
	}
}

// catchUp reads the stored events from pos on and delivers those not seen.
// Every event received before it starts is among them. A service that is
// away (restarting: no responders, or internal as it stops) or a reply lost
// with the connection does not end the stream: the catch-up is asked again
// after a pause, from where it got to, for as long as the stream lasts. So
// is a busy service: ctx.q.events holds no wait, so its timeout answer means
// too many queries in flight ("retry").
func (f *follower) catchUp(ctx context.Context) error {
	pauses := backoff.New(retryPause)
	for {
		err := f.catchUpOnce(ctx)
		if err == nil || ctx.Err() != nil || !(retryable(err) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrTimeout)) {
			return err
		}
		if backoff.Sleep(ctx, pauses.Next()) != nil {
			return context.Cause(ctx)
		}
	}
}

func (f *follower) catchUpOnce(ctx context.Context) error {
	f.epoch = f.c.epoch()
	// Only the requests end with a reconnect, not a send to the reader.
	rctx, cancel := f.c.untilReconnect(ctx)
	defer cancel()
	for raw, err := range f.c.storedEvents(rctx, f.conv, f.pos) {
		if err != nil {
			return reconnected(ctx, rctx, err)
		}
		f.pos++
		ev := decodeEvent(raw)
		id := ev.Header().ID
		_, known := f.seen[id] // delivered before, live or as progress
		f.seen[id] = true
		if known {
			continue
		}
		if err := f.send(ctx, ev); err != nil {
			return err
		}
	}
	return nil
}

// StoredEvents yields conv's events as the service committed them, oldest
// first, skipping the first after, and ends with the last one stored when
// it is read: a replay that ends (a CLI's replay, a page's first load), read
// through ctx.q.events (which works in a tenant's account). A conversation
// with no events, or none at all, yields nothing. An event of a type this
// client does not know comes as a *RawEvent. To go on with the live events
// without a gap, use Events with Replay instead.
func (c *Client) StoredEvents(ctx context.Context, conv string, after int) iter.Seq2[schema.Event, error] {
	return func(yield func(schema.Event, error) bool) {
		if err := badConversation(schema.VerbEvents, conv); err != nil {
			yield(nil, err)
			return
		}
		for raw, err := range c.storedEvents(ctx, conv, max(after, 0)) {
			if err != nil {
				yield(nil, err)
				return
			}
			if !yield(decodeEvent(raw), nil) {
				return
			}
		}
	}
}

// storedEvents yields conv's stored events from after on, oldest first,
// through ctx.q.events: in pages of the service's default size, smaller
// ones when a page does not fit in a reply (long summaries). A conversation
// the service does not know yet has none.
func (c *Client) storedEvents(ctx context.Context, conv string, after int) iter.Seq2[json.RawMessage, error] {
	return func(yield func(json.RawMessage, error) bool) {
		limit := 0 // the service's default
		for {
			var rep schema.EventsReply
			err := c.request(ctx, schema.VerbEvents, conv, schema.EventsRequest{ConversationID: conv, After: after, Limit: limit}, 0, &rep)
			switch {
			case errors.Is(err, ErrNotFound):
				return
			case errors.Is(err, ErrTooLarge) && limit != 1:
				if limit == 0 {
					limit = schema.MaxEventsLimit
				}
				limit = max(1, limit/2)
				continue
			case err != nil:
				yield(nil, err)
				return
			}
			for _, raw := range rep.Events {
				if !yield(raw, nil) {
					return
				}
			}
			if !rep.More {
				return
			}
			after = rep.Next
		}
	}
}

// live handles one message from a subscription.
func (f *follower) live(ctx context.Context, m queued) error {
	if f.pos >= 0 && !m.progress && m.epoch > f.epoch {
		// Received after a reconnect the stream has not caught up with
		// (a reader that lags leaves the status waiting behind queued
		// events): the events published while the connection was down
		// come before it, and counting it into pos would skip them.
		if err := f.catchUp(ctx); err != nil {
			return err
		}
	}
	ev := decodeEvent(m.data)
	id := ev.Header().ID
	committed, known := f.seen[id]
	switch {
	case m.progress && known, !m.progress && committed:
		return nil // delivered before
	case m.progress:
		f.seen[id] = false
	default:
		f.seen[id] = true
		// Not in the last catch-up (it would be seen) and received in its
		// epoch: the next committed event. One of an earlier epoch was
		// received before that catch-up started, so it was in it; should
		// one not be, pos is left alone rather than risk skipping events.
		if f.pos >= 0 && m.epoch == f.epoch {
			f.pos++
		}
		if known {
			return nil // its progress announcement was delivered
		}
	}
	return f.send(ctx, ev)
}

func (f *follower) send(ctx context.Context, ev schema.Event) error {
	select {
	case f.out <- ev:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// decodeEvent decodes an event; one of a type this client does not know
// comes back as a *RawEvent rather than failing the stream.
func decodeEvent(data []byte) schema.Event {
	if ev, err := schema.DecodeEvent(data); err == nil {
		return ev
	}
	raw := &RawEvent{Data: append(json.RawMessage(nil), data...)}
	_ = json.Unmarshal(data, &raw.EventHeader) // a header that does not decode leaves it empty
	return raw
}
