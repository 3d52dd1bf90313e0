package pipeline

import (
	"context"
	"encoding/json"

	"github.com/ctxpipe/ctxpipe/engine"
	"github.com/ctxpipe/ctxpipe/schema"
)

// status answers a ctx.q.status request.
func (q *queryServer) status(ctx context.Context, data []byte) []byte {
	req, bad := decodeRequest[schema.StatusRequest](data)
	if bad != nil {
		return bad
	}
	defer readSlot(ctx)()
	key := keyOf(ctx, req.ConversationID)
	st, found, err := q.stores.ForKey(key).State(ctx, key)
	if err != nil {
		return queryError(err)
	}
	if !found {
		return queryError(schema.QueryErrorf(schema.QueryNotFound, "no conversation %q", req.ConversationID))
	}
	stored, hidden, err := q.stores.ForKey(key).HiddenCount(ctx, key)
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
	if p, ok := q.profiles.Get(st.ProfileID); ok {
		reply.ContextWindow = p.ContextWindow
		reply.AllowedTokens = int(engine.AllowedTokens(&p))
		reply.Threshold, _ = p.Threshold(q.engine.Globals.AutoCondensePercent)
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

// events answers a ctx.q.events request: a conversation's events as
// committed, paged, so a UI or rewind consumer in a tenant account can
// replay them (it cannot read CTX_EVENTS, which lives in the service's
// account).
func (q *queryServer) events(ctx context.Context, data []byte) []byte {
	req, bad := decodeRequest[schema.EventsRequest](data)
	if bad != nil {
		return bad
	}
	defer readSlot(ctx)()
	key := keyOf(ctx, req.ConversationID)
	bodies, more, err := q.stores.ForKey(key).EventBodies(ctx, key, req.After, req.Limit)
	if err != nil {
		return queryError(err)
	}
	if len(bodies) == 0 && req.After == 0 {
		if bad := q.notFound(ctx, key, req.ConversationID); bad != nil {
			return bad
		}
	}
	rep := schema.EventsReply{ConversationID: req.ConversationID, Events: make([]json.RawMessage, len(bodies)), Next: req.After + len(bodies), More: more}
	size := 0
	for i, b := range bodies {
		rep.Events[i] = b
		size += len(b)
	}
	if q.maxReply > 0 && size > q.maxReply-1024 {
		return queryError(schema.QueryErrorf(schema.QueryTooLarge, "%d events are %d bytes, over the %d-byte message limit: ask with a smaller limit", len(bodies), size, q.maxReply))
	}
	b, err := schema.Marshal(rep)
	if err != nil {
		return queryError(err)
	}
	return b
}
