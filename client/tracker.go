package client

import (
	"context"
	"errors"
	"sync"

	"github.com/ctxpipe/ctxpipe/schema"
)

// Tracker keeps one view of a conversation current for a reader that reads
// it again and again, as an agent does after nearly every turn: each Read
// returns the whole view but asks the service only for the messages
// appended since the previous Read (ctx.q.history with after=<seq>). When
// the view changed in another way (a condense, truncation, rewind, pin),
// the service sends the whole view and the Tracker replaces what it held.
// A Tracker is safe for concurrent use; its Reads are serialized.
type Tracker struct {
	c        *Client
	conv     string
	view     schema.View
	pageSize int

	mu   sync.Mutex
	seq  int64 // of the view held; 0: read it whole
	msgs []schema.Message
}

// Track returns a Tracker of conv's view (View; effective by default).
// PageSize applies to the whole reads. Nothing is read until Read.
func (c *Client) Track(conv string, opts ...HistoryOption) *Tracker {
	h := historyConfig{view: schema.ViewEffective}
	for _, o := range opts {
		o(&h)
	}
	return &Tracker{c: c, conv: conv, view: h.view, pageSize: h.pageSize}
}

// Read returns the view as it is now, once input waitFor ("" for none) has
// been applied (a rejected one fails the Read with a *RejectedError). The
// reply's Seq is the conversation's change sequence it was read at; Reset
// says that the view changed other than by appends since the previous Read
// (or that this is the first). The messages must not be modified: the
// Tracker goes on from them.
//
// Like Wait, Read outlasts a service restart: no responders, an internal
// error and a reply lost with the connection are asked again after a short
// pause while ctx allows (the client's timeout when ctx has no deadline).
func (t *Tracker) Read(ctx context.Context, waitFor string) (*schema.HistoryReply, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var rep *schema.HistoryReply
	err := t.c.retry(ctx, func(ctx context.Context) (err error) {
		rep, err = t.read(ctx, waitFor)
		return err
	})
	if err != nil {
		return nil, err
	}
	return rep, nil
}

// read is one try of Read, with t.mu held.
func (t *Tracker) read(ctx context.Context, waitFor string) (*schema.HistoryReply, error) {
	if t.seq > 0 {
		rep, err := t.c.history(ctx, schema.HistoryRequest{ConversationID: t.conv, View: t.view, WaitFor: waitFor, After: t.seq})
		switch {
		case err == nil && rep.Seq > 0:
			if rep.Reset {
				t.msgs = rep.Messages
			} else {
				t.msgs = append(t.msgs, rep.Messages...)
			}
			t.seq = rep.Seq
			return t.reply(rep.Reset), nil
		case err == nil:
			// A service without the change sequence answered with the whole
			// view (it ignores after).
			t.msgs, t.seq = rep.Messages, 0
			return t.reply(true), nil
		case errors.Is(err, ErrTooLarge):
			// The whole view came back and did not fit: read it in pages.
			// The wait, if any, is done.
			waitFor = ""
		default:
			return nil, err
		}
	}
	opts := []HistoryOption{View(t.view), PageSize(t.pageSize)}
	if waitFor != "" {
		opts = append(opts, WaitFor(waitFor))
	}
	rep, err := t.c.History(ctx, t.conv, opts...)
	if err != nil {
		return nil, err
	}
	t.msgs, t.seq = rep.Messages, rep.Seq
	return t.reply(true), nil
}

func (t *Tracker) reply(reset bool) *schema.HistoryReply {
	// A full slice expression: a caller's append cannot write into the
	// Tracker's spare capacity.
	return &schema.HistoryReply{ConversationID: t.conv, View: t.view, Messages: t.msgs[:len(t.msgs):len(t.msgs)], Seq: t.seq, Reset: reset}
}
