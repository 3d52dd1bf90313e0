package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

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

// ListSubject is where a list of every instance's conversations is asked.
const ListSubject = "ctx.all.conversations"

// listWithin bounds how long a list waits for instances to answer.
const listWithin = 2 * time.Second

// The verbs of ctx.own only instances ask (never mapped from ctx.q).
const (
	verbConversation schema.QueryVerb = "conversation"
	verbMark         schema.QueryVerb = "mark"
)

// ConversationSummary is one conversation in a list: its state (without
// its system prompt and pins, which a list does not show), when it last
// changed, and its messages stored and hidden.
type ConversationSummary struct {
	Key       string                   `json:"key"`
	State     schema.ConversationState `json:"state"`
	UpdatedAt int64                    `json:"updated_at"`
	Stored    int                      `json:"stored"`
	Hidden    int                      `json:"hidden"`
}

// ConversationList is every instance's conversations, gathered.
type ConversationList struct {
	Conversations []ConversationSummary // in key order
	// Missing are the partitions no instance answered for in time: their
	// conversations are not listed.
	Missing []int
	// Truncated says an instance had more conversations than one reply
	// carries: it sent the most recently changed ones.
	Truncated bool
}

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

// listReply is one instance's answer to a list request.
type listReply struct {
	Instance      string                `json:"instance"`
	Partitions    []int                 `json:"partitions"`
	Conversations []ConversationSummary `json:"conversations"`
	Truncated     bool                  `json:"truncated,omitempty"`
}

// markReply answers a mark request.
type markReply struct {
	Mark string `json:"mark"`
}

// localList is this instance's answer to a list request: the
// conversations of the partitions it answers for, at most maxBytes of
// them (the most recently changed first), in key order.
func (q *queryServer) localList(ctx context.Context, maxBytes int) ([]byte, error) {
	rep := listReply{Instance: q.name, Partitions: q.parts.answered(), Conversations: []ConversationSummary{}}
	if len(rep.Partitions) > 0 {
		infos, err := q.stores.ConversationInfos(ctx)
		if err != nil {
			return nil, err
		}
		n := q.parts.partitions()
		for _, ci := range infos {
			tenant, conv := schema.SplitKey(ci.Key)
			if _, ok := slices.BinarySearch(rep.Partitions, bus.PartitionOf(tenant, conv, n)); !ok {
				continue // a standby's copy, or a partition held before
			}
			rep.Conversations = append(rep.Conversations, summaryOf(ci))
		}
	}
	return fitList(rep, maxBytes)
}

// fitList encodes rep within maxBytes (0: no bound), leaving out the
// least recently changed conversations if it must.
func fitList(rep listReply, maxBytes int) ([]byte, error) {
	b, err := json.Marshal(rep)
	if err != nil || maxBytes <= 0 || len(b) <= maxBytes {
		return b, err
	}
	all := rep.Conversations
	byRecent := slices.Clone(all)
	slices.SortStableFunc(byRecent, func(a, b ConversationSummary) int {
		switch {
		case a.UpdatedAt > b.UpdatedAt:
			return -1
		case a.UpdatedAt < b.UpdatedAt:
			return 1
		}
		return strings.Compare(a.Key, b.Key)
	})
	// The largest prefix of the most recent that fits, by bisection.
	lo, hi := 0, len(byRecent)
	var best []byte
	for lo < hi {
		mid := (lo + hi + 1) / 2
		rep.Conversations = slices.Clone(byRecent[:mid])
		slices.SortFunc(rep.Conversations, func(a, b ConversationSummary) int { return strings.Compare(a.Key, b.Key) })
		rep.Truncated = true
		if b, err = json.Marshal(rep); err != nil {
			return nil, err
		}
		if len(b) <= maxBytes {
			lo, best = mid, b
		} else {
			hi = mid - 1
		}
	}
	if best == nil {
		rep.Conversations, rep.Truncated = []ConversationSummary{}, true
		return json.Marshal(rep)
	}
	return best, nil
}

// mergeLists gathers instances' answers into one list of n+1 partitions:
// a conversation two instances sent (an owner handing over) once, as the
// one last changed has it.
func mergeLists(replies []listReply, n int) ConversationList {
	covered := make([]bool, n+1)
	byKey := map[string]ConversationSummary{}
	var out ConversationList
	for _, rep := range replies {
		for _, p := range rep.Partitions {
			if p >= 0 && p <= n {
				covered[p] = true
			}
		}
		out.Truncated = out.Truncated || rep.Truncated
		for _, c := range rep.Conversations {
			if prev, ok := byKey[c.Key]; !ok || c.UpdatedAt > prev.UpdatedAt {
				byKey[c.Key] = c
			}
		}
	}
	for p, ok := range covered {
		if !ok {
			out.Missing = append(out.Missing, p)
		}
	}
	out.Conversations = make([]ConversationSummary, 0, len(byKey))
	for _, c := range byKey {
		out.Conversations = append(out.Conversations, c)
	}
	slices.SortFunc(out.Conversations, func(a, b ConversationSummary) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// covers tells whether replies answer for every one of n+1 partitions.
func covers(replies []listReply, n int) bool {
	return len(mergeLists(replies, n).Missing) == 0
}

// listConversations asks every instance for its conversations over nc
// and gathers the answers (ListSubject).
func (q *queryServer) listConversations(ctx context.Context, nc *nats.Conn) (ConversationList, error) {
	n := q.parts.partitions()
	if n == 0 {
		return ConversationList{}, errors.New("the service is not consuming yet")
	}
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return ConversationList{}, fmt.Errorf("list conversations: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(ListSubject, inbox, nil); err != nil {
		return ConversationList{}, fmt.Errorf("list conversations: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, listWithin)
	defer cancel()
	var replies []listReply
	for !covers(replies, n) {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			break // the bound: what came is the list, Missing says the rest
		}
		var rep listReply
		if json.Unmarshal(m.Data, &rep) != nil {
			q.logger.Warn("an unreadable answer to a conversation list; left out", "bytes", len(m.Data))
			continue
		}
		replies = append(replies, rep)
	}
	return mergeLists(replies, n), nil
}

// serveList answers the list requests on ListSubject.
func (q *queryServer) serveList(ctx context.Context, nc *nats.Conn) (*nats.Subscription, error) {
	return nc.Subscribe(ListSubject, func(m *nats.Msg) {
		if !SafeReply(m.Reply) {
			q.logger.Warn("list refused: reply subject outside an inbox", "reply", m.Reply)
			return
		}
		go func() {
			reply, err := q.localList(ctx, q.maxReply-1024)
			if err != nil {
				q.logger.Warn("cannot list this instance's conversations", "err", err)
				return // the gatherer names its partitions missing
			}
			if err := m.Respond(reply); err != nil {
				q.logger.Warn("list reply failed", "err", err)
			}
		}()
	})
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

// summaryOf is a stored conversation as a list carries it.
func summaryOf(ci store.ConversationInfo) ConversationSummary {
	st := ci.State
	st.SystemPrompt, st.Pins, st.LastToolUseIDs = "", nil, nil
	return ConversationSummary{Key: ci.Key, State: st, UpdatedAt: ci.UpdatedAt, Stored: ci.Stored, Hidden: ci.Hidden}
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
