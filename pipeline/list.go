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

// A list of conversations is gathered from every instance: one request on
// ListSubject, which every instance receives (a plain subscription, not
// the queue group) and answers with the conversations of the partitions it
// answers queries for, naming those partitions (browse.go says why).

// ListSubject is where a list of every instance's conversations is asked.
const ListSubject = "ctx.all.conversations"

// listWithin bounds how long a list waits for instances to answer.
const listWithin = 2 * time.Second

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

// listReply is one instance's answer to a list request.
type listReply struct {
	Instance      string                `json:"instance"`
	Partitions    []int                 `json:"partitions"`
	Conversations []ConversationSummary `json:"conversations"`
	Truncated     bool                  `json:"truncated,omitempty"`
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

// summaryOf is a stored conversation as a list carries it.
func summaryOf(ci store.ConversationInfo) ConversationSummary {
	st := ci.State
	st.SystemPrompt, st.Pins, st.LastToolUseIDs = "", nil, nil
	return ConversationSummary{Key: ci.Key, State: st, UpdatedAt: ci.UpdatedAt, Stored: ci.Stored, Hidden: ci.Hidden}
}
