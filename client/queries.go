package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ctxpipe/ctxpipe/internal/backoff"
	"github.com/ctxpipe/ctxpipe/schema"
)

// request asks verb and decodes the reply into reply (nil: only whether it
// succeeded). wait is how long the service may hold the request (a
// wait_for); it lengthens the default deadline.
func (c *Client) request(ctx context.Context, verb schema.QueryVerb, conv string, req any, wait time.Duration, reply any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("ctxpipe %s %s: %w", verb, conv, err)
	}
	ctx, cancel := c.bound(ctx, wait)
	defer cancel()
	msg, err := c.nc.RequestWithContext(ctx, schema.QuerySubject(c.tenant, verb), body)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return fmt.Errorf("ctxpipe %s %s: %w (%w)", verb, conv, ErrNoService, err)
		}
		return fmt.Errorf("ctxpipe %s %s: %w", verb, conv, err)
	}
	err = schema.DecodeQueryReply(msg.Data, reply)
	var qe *schema.QueryErrorBody
	if errors.As(err, &qe) {
		return queryError(verb, conv, qe)
	}
	if err != nil {
		return fmt.Errorf("ctxpipe %s %s: %w", verb, conv, err)
	}
	return nil
}

// retryPause is the pause between the tries of a request that may succeed
// when sent again: the first, doubled after each try up to the longest.
var retryPause = backoff.Policy{First: 50 * time.Millisecond, Max: time.Second}

const (
	// retryLast is the least time a try must have left to be made.
	retryLast = 100 * time.Millisecond
)

// errReconnected is the cause of a request cut short because the
// connection dropped and came back while it was in flight: its reply,
// if the service sent one, went to the old connection.
var errReconnected = errors.New("ctxpipe: the connection dropped while the request was in flight")

// retryable reports whether err may go away when the request is sent
// again: no service answers (one is starting: an embedded NATS server is
// back before the service subscribes to its queries), the service failed
// (internal, "retrying may help": a store error, or a graceful stop
// answering what was pending), or the request was in flight when the
// connection dropped.
func retryable(err error) bool {
	return errors.Is(err, ErrNoService) || errors.Is(err, ErrInternal) || errors.Is(err, errReconnected)
}

// untilReconnect returns a ctx that is also canceled (cause
// errReconnected) when the connection comes back after a drop.
func (c *Client) untilReconnect(ctx context.Context) (context.Context, context.CancelFunc) {
	status := c.nc.StatusChanged(nats.CONNECTED)
	rctx, cancel := context.WithCancelCause(ctx)
	go func() {
		select {
		case _, ok := <-status:
			if ok {
				cancel(errReconnected)
			}
		case <-rctx.Done():
		}
	}()
	return rctx, func() {
		cancel(context.Canceled)
		c.nc.RemoveStatusListener(status)
	}
}

// reconnected returns err marked errReconnected when rctx (from
// untilReconnect over ctx) ended it because the connection came back.
func reconnected(ctx, rctx context.Context, err error) error {
	if err != nil && ctx.Err() == nil && errors.Is(err, context.Canceled) && errors.Is(context.Cause(rctx), errReconnected) {
		return fmt.Errorf("%w: %w", errReconnected, err)
	}
	return err
}

// retry runs op until it succeeds, fails for good, or ctx leaves no time
// for another try (the client's timeout from the first try when ctx has
// no deadline; it then bounds the later tries too), pausing between tries.
// A try is cut short, and made again, when the connection drops and comes
// back under it. It returns op's last error (with ctx's when ctx ended
// during a pause).
func (c *Client) retry(ctx context.Context, op func(context.Context) error) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(c.timeout)
	}
	tctx := ctx
	pauses := backoff.New(retryPause)
	for {
		rctx, cancel := c.untilReconnect(tctx)
		err := reconnected(tctx, rctx, op(rctx))
		cancel()
		pause := pauses.Next()
		if err == nil || !retryable(err) || time.Until(deadline) < pause+retryLast {
			return err
		}
		timer := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("%w: %w", context.Cause(ctx), err)
		case <-timer.C:
		}
		if !ok && tctx == ctx {
			var cancel context.CancelFunc
			tctx, cancel = context.WithDeadline(ctx, deadline)
			defer cancel()
		}
	}
}

// Status returns where conv stands against its profile's window: tokens,
// window, threshold, messages (hidden ones too), condenses, truncations.
// An unknown conversation is ErrNotFound.
func (c *Client) Status(ctx context.Context, conv string) (*schema.StatusReply, error) {
	if err := badConversation(schema.VerbStatus, conv); err != nil {
		return nil, err
	}
	var rep schema.StatusReply
	if err := c.request(ctx, schema.VerbStatus, conv, schema.StatusRequest{ConversationID: conv}, 0, &rep); err != nil {
		return nil, err
	}
	return &rep, nil
}

// HistoryOption shapes a history read.
type HistoryOption func(*historyConfig)

type historyConfig struct {
	view     schema.View
	waitFor  string
	pageSize int
	cursor   string
}

// View selects the view: schema.ViewEffective (the default: what the agent
// sends its model) or schema.ViewFull (every stored message with its tags).
func View(v schema.View) HistoryOption { return func(h *historyConfig) { h.view = v } }

// WaitFor makes the read wait until input id has been applied, so it holds
// that input's effects (an Append, a Condense, a Rewind). How long it waits
// follows the context's deadline (else the client's timeout). A rejected
// input fails the read with a *RejectedError.
func WaitFor(inputID string) HistoryOption { return func(h *historyConfig) { h.waitFor = inputID } }

// PageSize reads the history n messages per request (0: all in one reply
// while it fits in a NATS message; History then falls back to pages of
// 1,000 by itself).
func PageSize(n int) HistoryOption { return func(h *historyConfig) { h.pageSize = n } }

// Cursor starts HistoryPages at a page's NextCursor instead of the first
// message.
func Cursor(cursor string) HistoryOption { return func(h *historyConfig) { h.cursor = cursor } }

// maxRestarts bounds how often History reads a view again because it
// changed while being paged.
const maxRestarts = 8

// defaultPage is the page size History falls back to when a whole view does
// not fit in one reply.
const defaultPage = 1000

// History returns a whole view of conv, following next_cursor across pages
// when it does not fit in one reply (Total is then set, as on a paged
// reply). If the view changes between two pages (a condense, truncation or
// rewind in between), the service refuses the stale cursor and History
// reads again from the start, so the messages returned are always one
// consistent view. An unknown conversation is ErrNotFound. To read the same
// view again and again, Track it.
func (c *Client) History(ctx context.Context, conv string, opts ...HistoryOption) (*schema.HistoryReply, error) {
	h := historyConfig{view: schema.ViewEffective}
	for _, o := range opts {
		o(&h)
	}
	h.cursor = "" // a whole view starts at the start
	for attempt := 0; ; attempt++ {
		var all *schema.HistoryReply
		var err error
		for page, perr := range c.pages(ctx, conv, h) {
			if perr != nil {
				err = perr
				break
			}
			if all == nil {
				all = page
			} else {
				all.Messages = append(all.Messages, page.Messages...)
			}
			if page.NextCursor != "" {
				// Read in pages: say how many the whole view holds, as a
				// paged reply does.
				all.Total = page.Total
			}
			// The view assembled is the one of the last page: the cursors
			// held, so only appends happened in between, and they are in.
			all.Seq = page.Seq
		}
		switch {
		case err == nil:
			all.NextCursor = ""
			return all, nil
		case errors.Is(err, ErrStaleCursor) && attempt < maxRestarts:
			// The view changed under the paging: read it again, in pages
			// twice as large, so that fewer requests give a change less
			// room (too_large halves them again). The wait is done: the
			// first page had it.
			h.waitFor = ""
			h.pageSize = min(2*h.pageSize, schema.MaxHistoryLimit)
		case errors.Is(err, ErrTooLarge) && h.pageSize != 1:
			if h.pageSize == 0 {
				h.pageSize = defaultPage
			} else {
				h.pageSize = max(1, h.pageSize/2)
			}
		default:
			return nil, err
		}
	}
}

// HistoryPages reads a view of conv page by page (PageSize, default 1,000
// messages), starting at Cursor if given. Each page's NextCursor continues
// it; the last has none. A page whose cursor went stale (the view changed)
// yields an error matching ErrStaleCursor and ends the sequence: read again
// from the start.
func (c *Client) HistoryPages(ctx context.Context, conv string, opts ...HistoryOption) iter.Seq2[*schema.HistoryReply, error] {
	h := historyConfig{view: schema.ViewEffective, pageSize: defaultPage}
	for _, o := range opts {
		o(&h)
	}
	return c.pages(ctx, conv, h)
}

func (c *Client) pages(ctx context.Context, conv string, h historyConfig) iter.Seq2[*schema.HistoryReply, error] {
	return func(yield func(*schema.HistoryReply, error) bool) {
		if err := badConversation(schema.VerbHistory, conv); err != nil {
			yield(nil, err)
			return
		}
		cursor, waitFor := h.cursor, h.waitFor
		for {
			req := schema.HistoryRequest{ConversationID: conv, View: h.view, WaitFor: waitFor, Limit: h.pageSize, Cursor: cursor}
			rep, err := c.history(ctx, req)
			if err != nil {
				yield(nil, err)
				return
			}
			if !yield(rep, nil) || rep.NextCursor == "" {
				return
			}
			cursor, waitFor = rep.NextCursor, ""
		}
	}
}

// history sends one request, validated here first: a bad_request the
// service answers to a request the client checked can only be the cursor's.
func (c *Client) history(ctx context.Context, req schema.HistoryRequest) (*schema.HistoryReply, error) {
	var wait time.Duration
	if req.WaitFor != "" {
		wait = c.waitBudget(ctx)
		req.TimeoutMS = max(wait.Milliseconds(), 1)
	}
	if err := req.Validate(); err != nil {
		var qe *schema.QueryErrorBody
		if errors.As(err, &qe) {
			return nil, queryError(schema.VerbHistory, req.ConversationID, qe)
		}
		return nil, err
	}
	var rep schema.HistoryReply
	err := c.request(ctx, schema.VerbHistory, req.ConversationID, req, wait, &rep)
	var qe *QueryError
	switch {
	case err == nil:
		return &rep, nil
	case errors.As(err, &qe) && qe.Code == schema.QueryInputRejected:
		return nil, c.rejected(ctx, req.ConversationID, req.WaitFor, qe.Message)
	case errors.As(err, &qe) && qe.Code == schema.QueryBadRequest && req.Cursor != "":
		return nil, fmt.Errorf("%w: %w", ErrStaleCursor, err)
	}
	return nil, err
}

// waitBudget is how long the service may hold a wait_for: what is left of
// ctx's deadline less a margin for the reply to come back, else the
// client's timeout; at most schema.MaxQueryTimeout (Wait asks again when
// ctx allows longer).
func (c *Client) waitBudget(ctx context.Context) time.Duration {
	d := c.timeout
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		d = left - min(left/5, time.Second)
	}
	return max(min(d, schema.MaxQueryTimeout), time.Millisecond)
}

// Wait returns once input inputID of conv has been applied (its effects are
// readable), or a *RejectedError with the reason when the service rejected
// it. It waits while ctx allows (the client's timeout when ctx has no
// deadline); past that it fails with ErrTimeout (and, when ctx's deadline
// ran out before the service answered, context.DeadlineExceeded too).
// Meanwhile it outlasts a service restart: no responders (ErrNoService),
// an internal error and a reply lost with the connection are asked again
// after a short pause, and only end the wait, with ErrTimeout, when ctx
// has no time left.
func (c *Client) Wait(ctx context.Context, conv, inputID string) error {
	if inputID == "" {
		// The service reads an empty wait_for as "no wait": it would
		// answer at once, as if the input had been applied.
		return fmt.Errorf("ctxpipe wait in %s: %w: an input id is required", conv, ErrBadRequest)
	}
	start := time.Now()
	pauses := backoff.New(retryPause)
	for {
		asked := time.Now()
		err := c.retry(ctx, func(ctx context.Context) error {
			// One message is enough to learn the input was applied.
			_, err := c.history(ctx, schema.HistoryRequest{ConversationID: conv, WaitFor: inputID, Limit: 1})
			return err
		})
		if errors.Is(err, context.DeadlineExceeded) || (retryable(err) && ctx.Err() == nil) {
			// The deadline ran out before the service's timeout reply came
			// back, or while the service was away: the same outcome.
			return fmt.Errorf("ctxpipe wait for %s: %w after %v: %w", inputID, ErrTimeout, waited(start), err)
		}
		if err == nil || !errors.Is(err, ErrTimeout) {
			return err
		}
		// The service caps one wait at schema.MaxQueryTimeout: ask again
		// while ctx has time left.
		dl, ok := ctx.Deadline()
		if !ok || time.Until(dl) < 100*time.Millisecond {
			// The service's message names its own last wait only.
			return fmt.Errorf("ctxpipe wait for %s: %v in all: %w", inputID, waited(start), err)
		}
		if time.Since(asked) >= time.Second {
			pauses.Reset()
			continue
		}
		// A timeout answered at once is the service refusing to wait (too
		// many waits pending, or this tenant's share of queries in flight):
		// asked again at once, thousands of times a second, it would only
		// add to the load. Pause, longer each time.
		if backoff.Sleep(ctx, min(pauses.Next(), time.Until(dl)-100*time.Millisecond)) != nil {
			return fmt.Errorf("ctxpipe wait for %s: %v in all: %w", inputID, waited(start), err)
		}
	}
}

// waited is the time since start, rounded for a message.
func waited(start time.Time) time.Duration { return time.Since(start).Round(time.Millisecond) }

// rejected builds the *RejectedError for input id from the service's
// input_rejected reply, with the human message of its input_rejected event
// when that can be read.
func (c *Client) rejected(ctx context.Context, conv, id, msg string) error {
	e := &RejectedError{InputID: id, ConversationID: conv, Reason: rejectedReason(msg), Message: msg}
	for raw, err := range c.storedEvents(ctx, conv, 0) {
		if err != nil {
			break // best effort: the reason code is known already
		}
		if ev, err := schema.DecodeEvent(raw); err == nil {
			if r, ok := ev.(*schema.InputRejected); ok && r.InputID == id {
				e.Reason, e.Message = r.Reason, r.Message
				break
			}
		}
	}
	return e
}
