package pipeline

import (
	"context"
	"strconv"
	"strings"

	"github.com/ctxpipe/ctxpipe/engine"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/store"
)

// history answers a ctx.q.history request.
func (q *queryServer) history(ctx context.Context, data []byte) []byte {
	req, bad := decodeRequest[schema.HistoryRequest](data)
	if bad != nil {
		return bad
	}
	key := keyOf(ctx, req.ConversationID)
	if req.WaitFor != "" {
		if err := q.waitFor(ctx, key, req.WaitFor, req.Timeout(defaultWait)); err != nil {
			return queryError(err)
		}
	}
	defer readSlot(ctx)()
	// The effective view reads only what no summary or marker hides:
	// bounded by the context, not by the length of the whole history. An
	// incremental read reads only what was appended.
	h, err := q.stores.ForKey(key).ReadHistory(ctx, key, req.View == schema.ViewEffective, req.After)
	if err != nil {
		return queryError(err)
	}
	var page historyPage
	if h.Incremental {
		var ok bool
		if page.msgs, ok = appendedView(h, req.View); !ok {
			// A tool result of the appended messages answers a call further
			// back than the tail read: read it all.
			if h, err = q.stores.ForKey(key).ReadHistory(ctx, key, req.View == schema.ViewEffective, 0); err != nil {
				return queryError(err)
			}
		}
	}
	msgs := h.Messages
	if len(msgs) == 0 && h.Seq == 0 {
		if bad := q.notFound(ctx, key, req.ConversationID); bad != nil {
			return bad
		}
	}
	if !h.Incremental {
		out := msgs
		if req.View == schema.ViewEffective {
			out = engine.EffectiveHistory(msgs)
		}
		if page, err = pageOf(out, req, h.ResetSeq); err != nil {
			return queryError(err)
		}
		page.reset = req.After > 0
	}
	page.seq = h.Seq
	b, err := encodeHistory(req.ConversationID, req.View, page, stored(msgs, h.Bodies))
	if err != nil {
		return queryError(err)
	}
	if q.maxReply > 0 && len(b) > q.maxReply {
		n := max(1, len(page.msgs)*q.maxReply/len(b)/2)
		return queryError(schema.QueryErrorf(schema.QueryTooLarge,
			"the reply is %d bytes (%d messages), over the %d-byte message limit: ask with \"limit\" (about %d fits) and follow next_cursor",
			len(b), len(page.msgs), q.maxReply, n))
	}
	return b
}

// historyPage is the slice of a view one reply carries.
type historyPage struct {
	msgs  []schema.Message
	total int    // messages in the whole view; 0 when not paged
	next  string // cursor of the next page; "" at the end
	seq   int64  // the conversation's change sequence
	reset bool   // an incremental read got the whole view
}

// appendedView is the part of the view made of the messages an
// incremental read found appended (those with bodies), which are its last
// messages. In the effective view a tool result stays only if its call is in
// an earlier effective message; ok is false when one of them answers a call
// the read's tail does not hold, which only the whole history can settle.
func appendedView(h store.History, view schema.View) (msgs []schema.Message, ok bool) {
	out := h.Messages
	if view == schema.ViewEffective {
		calls := map[string]bool{}
		for i := range h.Messages {
			m := &h.Messages[i]
			for _, b := range m.Content.Blocks {
				switch {
				case b.Type == schema.BlockToolUse && m.Role == schema.RoleAssistant:
					calls[b.ID] = true
				case b.Type == schema.BlockToolResult && h.Bodies[m.ID] != nil && !calls[b.ToolUseID]:
					return nil, false
				}
			}
		}
		out = engine.EffectiveHistory(h.Messages)
	}
	i := len(out)
	for i > 0 && h.Bodies[out[i-1].ID] != nil {
		i--
	}
	return out[i:len(out):len(out)], true
}

// pageOf cuts the page a request asks for out of a view. A cursor is
// "<offset>.<reset>.<id of the message before offset>", reset being the
// conversation's reset seq when the page was read: a condense, truncation,
// mask, pin or rewind in between moves it (and may retag the messages
// before offset without moving any), an append does not. A cursor whose
// reset or id no longer holds is refused, and the client reads again from
// the start rather than getting a page that does not follow the last.
func pageOf(view []schema.Message, req schema.HistoryRequest, reset int64) (historyPage, error) {
	if req.Limit == 0 && req.Cursor == "" {
		return historyPage{msgs: view}, nil
	}
	from := 0
	if req.Cursor != "" {
		off, rest, ok1 := strings.Cut(req.Cursor, ".")
		at, id, ok2 := strings.Cut(rest, ".")
		n, err1 := strconv.Atoi(off)
		r, err2 := strconv.ParseInt(at, 10, 64)
		if !ok1 || !ok2 || err1 != nil || err2 != nil || r != reset || n < 1 || n > len(view) || view[n-1].ID != id {
			return historyPage{}, schema.QueryErrorf(schema.QueryBadRequest,
				"cursor %q does not continue this history (it changed since, or the cursor is not ours): read again without a cursor", req.Cursor)
		}
		from = n
	}
	to := len(view)
	if req.Limit > 0 {
		to = min(to, from+req.Limit)
	}
	p := historyPage{msgs: view[from:to], total: len(view)}
	if to < len(view) {
		p.next = strconv.Itoa(to) + "." + strconv.FormatInt(reset, 10) + "." + view[to-1].ID
	}
	return p, nil
}

// storedBody is a message's body as stored, and how many blocks it had.
type storedBody struct {
	body   []byte
	blocks int
}

// stored indexes the bodies that are exactly their message's JSON: those of
// messages without parent tags (the store keeps the tags in columns).
func stored(msgs []schema.Message, bodies map[string][]byte) map[string]storedBody {
	out := make(map[string]storedBody, len(bodies))
	for i := range msgs {
		if b, ok := bodies[msgs[i].ID]; ok && msgs[i].CondenseParent == "" && msgs[i].TruncationParent == "" {
			out[msgs[i].ID] = storedBody{b, len(msgs[i].Content.Blocks)}
		}
	}
	return out
}

// encodeHistory writes the reply schema.Marshal(schema.HistoryReply{...})
// would, but sends each untagged, unedited message's stored body as it is:
// encoding a long history again on every read (agents read after nearly
// every turn) was most of the service's CPU.
func encodeHistory(conv string, view schema.View, page historyPage, bodies map[string]storedBody) ([]byte, error) {
	msgs := page.msgs
	head, err := schema.Marshal(schema.HistoryReply{ConversationID: conv, View: view, Messages: []schema.Message{}})
	if err != nil {
		return nil, err
	}
	size := len(head)
	for _, m := range msgs {
		size += len(bodies[m.ID].body) + 1
	}
	buf := make([]byte, 0, size+64)
	buf = append(buf, head[:len(head)-2]...) // up to and including "messages":[
	for i := range msgs {
		if i > 0 {
			buf = append(buf, ',')
		}
		// The effective history drops orphaned tool results: such a message
		// has fewer blocks than its stored body and is encoded anew.
		if sb, ok := bodies[msgs[i].ID]; ok && sb.blocks == len(msgs[i].Content.Blocks) && msgs[i].CondenseParent == "" && msgs[i].TruncationParent == "" {
			buf = append(buf, sb.body...)
			continue
		}
		b, err := schema.Marshal(&msgs[i])
		if err != nil {
			return nil, err
		}
		buf = append(buf, b...)
	}
	buf = append(buf, ']')
	if page.total > 0 {
		buf = append(buf, `,"total":`...)
		buf = strconv.AppendInt(buf, int64(page.total), 10)
	}
	if page.next != "" {
		buf = append(buf, `,"next_cursor":`...)
		buf = strconv.AppendQuote(buf, page.next)
	}
	if page.seq != 0 {
		buf = append(buf, `,"seq":`...)
		buf = strconv.AppendInt(buf, page.seq, 10)
	}
	if page.reset {
		buf = append(buf, `,"reset":true`...)
	}
	return append(buf, '}'), nil
}
