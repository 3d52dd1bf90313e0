package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/store"
)

// Each instance keeps only its partitions' conversations, so a dashboard
// served by any instance reads through all of them:
//
//   - The list is gathered: one request on ctx.all.conversations, which
//     every instance receives (a plain subscription, not the queue group)
//     and answers with the conversations of the partitions it answers
//     queries for (it owns them, restored), naming those partitions. The
//     gathering ends once every partition is covered, or after listWithin,
//     and says which partitions nobody answered for (an owner taking over).
//   - One conversation's view, and the mark an open page polls to learn
//     that it changed, go to the partition's owner as queries do (route.go),
//     under verbs only instances use: ctx.own.<p>.<tenant>.conversation and
//     .mark.
//
// Only the service's user may publish or subscribe on ctx.all.> (nats.conf);
// no tenant account has a subject that leads there.

// The verbs of ctx.own only instances ask (never mapped from ctx.q).
const (
	verbConversation schema.QueryVerb = "conversation"
	verbMark         schema.QueryVerb = "mark"
)

// ConversationView is one conversation as its owner's file holds it: the
// state, every message (hidden ones included), when it last changed and its
// events as stored.
type ConversationView struct {
	State     schema.ConversationState `json:"state"`
	Messages  []schema.Message         `json:"messages"`
	UpdatedAt int64                    `json:"updated_at"`
	Events    []json.RawMessage        `json:"events"`
}

// ErrNoConversation means the conversation has no stored state.
var ErrNoConversation = errors.New("no such conversation")

// markReply answers a mark request.
type markReply struct {
	Mark string `json:"mark"`
}

// conversationReply answers the conversation verb: the view of the
// conversation in the request (a status request's body), from this file.
func (q *queryServer) conversationReply(ctx context.Context, data []byte) []byte {
	req, bad := decodeRequest[schema.StatusRequest](data)
	if bad != nil {
		return bad
	}
	defer readSlot(ctx)()
	v, err := q.localView(ctx, keyOf(ctx, req.ConversationID))
	if errors.Is(err, ErrNoConversation) {
		return queryError(schema.QueryErrorf(schema.QueryNotFound, "no conversation %q", req.ConversationID))
	}
	if err != nil {
		return queryError(err)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return queryError(err)
	}
	if q.maxReply > 0 && len(b) > q.maxReply-1024 {
		return queryError(schema.QueryErrorf(schema.QueryTooLarge, "the conversation is %d bytes, over the %d-byte message limit", len(b), q.maxReply))
	}
	return b
}

// localView reads conversation key from this instance's file.
func (q *queryServer) localView(ctx context.Context, key string) (ConversationView, error) {
	return viewOf(ctx, q.stores, key)
}

// ConversationReader is what reading conversations takes of the state: a
// *store.Store, or the *store.Set of an instance whose state is split over
// files.
type ConversationReader interface {
	ConversationInfos(ctx context.Context) ([]store.ConversationInfo, error)
	InputMark(ctx context.Context) (int64, error)
	Load(ctx context.Context, key string) (store.Snapshot, error)
	UpdatedAt(ctx context.Context, key string) (int64, bool, error)
	Events(ctx context.Context, key string) ([]schema.Event, error)
	State(ctx context.Context, key string) (schema.ConversationState, bool, error)
}

// viewOf reads conversation key from s.
func viewOf(ctx context.Context, s ConversationReader, key string) (ConversationView, error) {
	snap, err := s.Load(ctx, key)
	if err != nil {
		return ConversationView{}, err
	}
	if !snap.Found {
		return ConversationView{}, ErrNoConversation
	}
	updated, _, err := s.UpdatedAt(ctx, key)
	if err != nil {
		return ConversationView{}, err
	}
	events, err := s.Events(ctx, key)
	if err != nil {
		return ConversationView{}, err
	}
	v := ConversationView{State: snap.State, Messages: snap.Messages, UpdatedAt: updated,
		Events: make([]json.RawMessage, len(events))}
	for i, e := range events {
		if v.Events[i], err = schema.Marshal(e); err != nil {
			return ConversationView{}, err
		}
	}
	return v, nil
}

// markReply answers the mark verb.
func (q *queryServer) markReply(ctx context.Context, data []byte) []byte {
	req, bad := decodeRequest[schema.StatusRequest](data)
	if bad != nil {
		return bad
	}
	defer readSlot(ctx)()
	mark, err := q.localMark(ctx, keyOf(ctx, req.ConversationID))
	if errors.Is(err, ErrNoConversation) {
		return queryError(schema.QueryErrorf(schema.QueryNotFound, "no conversation %q", req.ConversationID))
	}
	if err != nil {
		return queryError(err)
	}
	b, err := json.Marshal(markReply{Mark: mark})
	if err != nil {
		return queryError(err)
	}
	return b
}

// localMark is conversation key's mark in this instance's file.
func (q *queryServer) localMark(ctx context.Context, key string) (string, error) {
	return markOf(ctx, q.stores, key)
}

// markOf changes whenever conversation key's state in s does. Two commits
// in one millisecond share an updated_at, so the state's own counters are
// part of it.
func markOf(ctx context.Context, s ConversationReader, key string) (string, error) {
	at, found, err := s.UpdatedAt(ctx, key)
	if err != nil {
		return "", err
	}
	st, found2, err := s.State(ctx, key)
	if err != nil {
		return "", err
	}
	if !found || !found2 {
		return "", ErrNoConversation
	}
	return fmt.Sprint(at, st.Messages, st.ContextTokens, st.Condensations, st.Truncations, st.LastTS), nil
}

// conversation reads conversation key from the instance that owns its
// partition (this one, or another over nc).
func (q *queryServer) conversation(ctx context.Context, nc *nats.Conn, key string) (ConversationView, error) {
	var v ConversationView
	err := q.ask(ctx, nc, key, verbConversation, &v, func(ctx context.Context) error {
		var err error
		v, err = q.localView(ctx, key)
		return err
	})
	return v, err
}

// conversationMark is conversation key's mark (it changes whenever the
// conversation does), from the instance that owns its partition.
func (q *queryServer) conversationMark(ctx context.Context, nc *nats.Conn, key string) (string, error) {
	var rep markReply
	err := q.ask(ctx, nc, key, verbMark, &rep, func(ctx context.Context) error {
		var err error
		rep.Mark, err = q.localMark(ctx, key)
		return err
	})
	return rep.Mark, err
}

// ask runs local when this instance answers for key's partition, and
// otherwise asks the owner for verb over nc, decoding its answer into out.
func (q *queryServer) ask(ctx context.Context, nc *nats.Conn, key string, verb schema.QueryVerb, out any, local func(context.Context) error) error {
	if !schema.ValidConversationKey(key) {
		return fmt.Errorf("%q is not a conversation key", key)
	}
	tenant, conv := schema.SplitKey(key)
	p := bus.PartitionOf(tenant, conv, q.parts.partitions())
	if q.parts.answersHere(p) {
		return local(ctx)
	}
	body, err := json.Marshal(schema.StatusRequest{ConversationID: conv})
	if err != nil {
		return err
	}
	reply := q.forward(ctx, nc, ownSubject(p, tenant, verb), body, 0)
	var qe schema.QueryError
	if json.Unmarshal(reply, &qe) == nil && qe.Error.Code != "" {
		if qe.Error.Code == schema.QueryNotFound {
			return ErrNoConversation
		}
		return &qe.Error
	}
	if err := json.Unmarshal(reply, out); err != nil {
		return fmt.Errorf("the owner's answer: %w", err)
	}
	return nil
}

// changelogMark moves whenever any instance commits anything: the last
// sequence of CTX_STATE, where every commit is appended before it is
// committed.
func (q *queryServer) changelogMark(ctx context.Context) (int64, error) {
	s, err := q.js.Stream(ctx, bus.StreamState)
	if err != nil {
		return 0, err
	}
	return int64(s.CachedInfo().State.LastSeq), nil
}

// Browser reads the conversations of every instance for the dashboard:
// lists are gathered from all of them, a conversation is read from its
// partition's owner, and the mark is CTX_STATE's.
type Browser struct {
	R  *Runner
	NC *nats.Conn
}

func (b Browser) Conversations(ctx context.Context) (ConversationList, error) {
	return b.R.queries.listConversations(ctx, b.NC)
}

func (b Browser) Conversation(ctx context.Context, key string) (ConversationView, error) {
	return b.R.queries.conversation(ctx, b.NC, key)
}

func (b Browser) ConversationMark(ctx context.Context, key string) (string, error) {
	return b.R.queries.conversationMark(ctx, b.NC, key)
}

func (b Browser) Mark(ctx context.Context) (int64, error) { return b.R.queries.changelogMark(ctx) }

// StoreBrowser reads the conversations of one instance's state (its file,
// or its set of files), or of a file opened for inspection.
type StoreBrowser struct{ Store ConversationReader }

func (b StoreBrowser) Conversations(ctx context.Context) (ConversationList, error) {
	infos, err := b.Store.ConversationInfos(ctx)
	if err != nil {
		return ConversationList{}, err
	}
	out := ConversationList{Conversations: make([]ConversationSummary, 0, len(infos))}
	for _, ci := range infos {
		out.Conversations = append(out.Conversations, summaryOf(ci))
	}
	return out, nil
}

func (b StoreBrowser) Conversation(ctx context.Context, key string) (ConversationView, error) {
	return viewOf(ctx, b.Store, key)
}

func (b StoreBrowser) ConversationMark(ctx context.Context, key string) (string, error) {
	return markOf(ctx, b.Store, key)
}

// Mark moves whenever an input is stored in the file (store.InputMark).
func (b StoreBrowser) Mark(ctx context.Context) (int64, error) { return b.Store.InputMark(ctx) }
