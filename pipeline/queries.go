package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/stages"
	"github.com/ctxpipe/ctxpipe/store"
)

// QueryInputRejected answers a history query whose wait_for input was
// rejected: the agent learns its turn did not land.
const QueryInputRejected schema.QueryCode = "input_rejected"

// defaultWait is how long wait_for waits when the request names no timeout.
const defaultWait = 10 * time.Second

// ServeQueries answers ctx.q.history and ctx.q.status from SQLite in the
// queue group, so each query is answered by one instance. Each request runs
// in its own goroutine (at most maxConcurrent at once), so a long wait_for
// never holds up the others. The returned func unsubscribes.
func (r *Runner) ServeQueries(ctx context.Context, nc *nats.Conn) (func() error, error) {
	const maxConcurrent = 256
	sem := make(chan struct{}, maxConcurrent)
	serve := func(h func(context.Context, []byte) []byte) nats.MsgHandler {
		return func(m *nats.Msg) {
			sem <- struct{}{}
			go func() {
				defer func() { <-sem }()
				if err := m.Respond(h(ctx, m.Data)); err != nil && !errors.Is(err, nats.ErrMsgNoReply) {
					r.Log.Warn("query reply failed", "subject", m.Subject, "err", err)
				}
			}()
		}
	}
	hs, err := nc.QueueSubscribe(schema.SubjectHistory, bus.QueueGroup, serve(r.History))
	if err != nil {
		return nil, err
	}
	ss, err := nc.QueueSubscribe(schema.SubjectStatus, bus.QueueGroup, serve(r.Status))
	if err != nil {
		_ = hs.Unsubscribe()
		return nil, err
	}
	return func() error { return errors.Join(hs.Drain(), ss.Drain()) }, nil
}

func queryError(err error) []byte {
	var qe *schema.QueryErrorBody
	if errors.As(err, &qe) {
		return schema.MarshalQueryError(qe.Code, qe.Message)
	}
	return schema.MarshalQueryError(schema.QueryInternal, err.Error())
}

// History answers a ctx.q.history request.
func (r *Runner) History(ctx context.Context, data []byte) []byte {
	var req schema.HistoryRequest
	if err := json.Unmarshal(data, &req); err != nil {
		return schema.MarshalQueryError(schema.QueryBadRequest, "request is not valid JSON: "+err.Error())
	}
	if err := req.Validate(); err != nil {
		return queryError(err)
	}
	if req.WaitFor != "" {
		if err := r.waitFor(ctx, req.WaitFor, req.Timeout(defaultWait)); err != nil {
			return queryError(err)
		}
	}
	load := r.Store.MessagesRaw
	if req.View == schema.ViewEffective {
		// Only what no summary or marker hides: bounded by the context, not
		// by the length of the whole history.
		load = r.Store.Visible
	}
	msgs, bodies, err := load(ctx, req.ConversationID)
	if err != nil {
		return queryError(err)
	}
	if len(msgs) == 0 {
		if _, found, err := r.Store.State(ctx, req.ConversationID); err != nil {
			return queryError(err)
		} else if !found {
			return queryError(schema.QueryErrorf(schema.QueryNotFound, "no conversation %q", req.ConversationID))
		}
	}
	out := msgs
	if req.View == schema.ViewEffective {
		out = stages.EffectiveHistory(msgs)
	}
	b, err := encodeHistory(req.ConversationID, req.View, out, stored(msgs, bodies))
	if err != nil {
		return queryError(err)
	}
	return b
}

// storedBody is a message's body as stored, and how many blocks it had.
type storedBody struct {
	body   []byte
	blocks int
}

// stored indexes the bodies that are exactly their message's JSON: those of
// messages without parent tags (the store keeps the tags in columns).
func stored(msgs []schema.Message, bodies [][]byte) map[string]storedBody {
	out := make(map[string]storedBody, len(msgs))
	for i := range msgs {
		if i < len(bodies) && msgs[i].CondenseParent == "" && msgs[i].TruncationParent == "" {
			out[msgs[i].ID] = storedBody{bodies[i], len(msgs[i].Content.Blocks)}
		}
	}
	return out
}

// encodeHistory writes the reply schema.Marshal(schema.HistoryReply{...})
// would, but sends each untagged, unedited message's stored body as it is:
// encoding a long history again on every read (agents read after nearly
// every turn) was most of the service's CPU.
func encodeHistory(conv string, view schema.View, msgs []schema.Message, bodies map[string]storedBody) ([]byte, error) {
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
	return append(buf, "]}"...), nil
}

// waitFor returns once input id is committed, or an error on timeout or
// when the input was rejected.
func (r *Runner) waitFor(ctx context.Context, id string, timeout time.Duration) error {
	check := func() (bool, error) {
		status, reason, found, err := r.Store.InputStatus(ctx, id)
		if err != nil || !found {
			return false, err
		}
		if status == store.StatusRejected {
			return true, schema.QueryErrorf(QueryInputRejected, "input %s was rejected: %s", id, reason)
		}
		return true, nil
	}
	if ok, err := check(); ok || err != nil {
		return err
	}
	ch, cancel := r.waiters.wait(id)
	defer cancel()
	// Checked again after registering: the commit may have landed between.
	if ok, err := check(); ok || err != nil {
		return err
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-ch:
		_, err := check()
		return err
	case <-t.C:
		return schema.QueryErrorf(schema.QueryTimeout, "input %s was not applied within %v", id, timeout)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Status answers a ctx.q.status request.
func (r *Runner) Status(ctx context.Context, data []byte) []byte {
	var req schema.StatusRequest
	if err := json.Unmarshal(data, &req); err != nil {
		return schema.MarshalQueryError(schema.QueryBadRequest, "request is not valid JSON: "+err.Error())
	}
	if err := req.Validate(); err != nil {
		return queryError(err)
	}
	st, found, err := r.Store.State(ctx, req.ConversationID)
	if err != nil {
		return queryError(err)
	}
	if !found {
		return queryError(schema.QueryErrorf(schema.QueryNotFound, "no conversation %q", req.ConversationID))
	}
	stored, hidden, err := r.Store.HiddenCount(ctx, req.ConversationID)
	if err != nil {
		return queryError(err)
	}
	reply := schema.StatusReply{
		ConversationID: req.ConversationID,
		ProfileID:      st.ProfileID,
		ContextTokens:  st.ContextTokens,
		Messages:       stored,
		HiddenMessages: hidden,
		Condensations:  st.Condensations,
		Truncations:    st.Truncations,
	}
	if p, ok := r.Profiles.Get(st.ProfileID); ok {
		reply.ContextWindow = p.ContextWindow
		reply.AllowedTokens = int(stages.AllowedTokens(&p))
		reply.Threshold = p.EffectiveThreshold(r.Engine.Globals.AutoCondensePercent, nil)
		if p.ContextWindow > 0 {
			reply.Percent = float64(int(10000*float64(st.ContextTokens)/float64(p.ContextWindow))) / 100
		}
	}
	b, err := schema.Marshal(reply)
	if err != nil {
		return queryError(err)
	}
	return b
}
