package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/engine"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/store"
)

// queryServer answers the ctx.q.* queries (history, status, events, and
// wait_for) and the dashboard's reads from this instance's files, for the
// conversations of the partitions this instance pulls; any other it passes
// on to the partition's owner (route.go). A list of conversations is
// gathered from every instance (browse.go).
type queryServer struct {
	stores   *store.Set
	profiles *Profiles
	engine   *engine.Engine
	// waiters learn of every commit (Runner.committed): wait_for.
	waiters *waiters
	// parts tells which partitions this instance answers for.
	parts servedPartitions
	js    jetstream.JetStream
	// name is this instance's (Config.Name); maxReads and maxWaits bound
	// the queries reading the store at once and the wait_for waits
	// pending (Config.MaxQueryReads, MaxQueryWaits).
	name               string
	maxReads, maxWaits int
	logger             *slog.Logger
	metrics            *Metrics
	// maxReply is the connection's max payload: a reply must fit (set by
	// serve).
	maxReply int
	// owned serves the queries other instances pass on, for the
	// partitions pulled (set by serve).
	owned atomic.Pointer[owned]
}

// servedPartitions is what the query server needs to know of the
// partitions (ownership implements it).
type servedPartitions interface {
	// partitions is N, 0 while it is not known yet.
	partitions() int
	// answersHere tells whether this instance answers partition p's
	// queries; answered lists the partitions it does.
	answersHere(p int) bool
	answered() []int
}

// serve answers ctx.q.history and ctx.q.status from SQLite in the
// queue group, so each query is answered by one instance. Each request runs
// in its own goroutine. Reading the store is bounded (at most
// maxConcurrent at once); waiting for a wait_for input is not, so any
// number of pending waits never delays a status or history read (the waits
// themselves are capped at maxWaits). The returned func unsubscribes.
func (q *queryServer) serve(ctx context.Context, nc *nats.Conn) (func() error, error) {
	maxConcurrent, maxWaits := q.maxReads, q.maxWaits
	reads := make(chan struct{}, maxConcurrent)
	waits := make(chan struct{}, maxWaits)
	// Every query in flight, waiting or reading: a flood beyond it is
	// answered at once instead of piling up goroutines.
	inflight := make(chan struct{}, maxConcurrent+maxWaits)
	// A quarter of that per tenant: one tenant holding every slot (65,536
	// waits of a minute each) would have every other tenant's queries
	// refused.
	shares := newTenantShares(max((maxConcurrent+maxWaits)/4, 1))
	q.maxReply = int(nc.MaxPayload())
	handlers := map[schema.QueryVerb]func(context.Context, []byte) []byte{
		schema.VerbHistory: q.history, schema.VerbStatus: q.status, schema.VerbEvents: q.events,
	}
	// Asked only by other instances, on ctx.own (browse.go).
	internal := map[schema.QueryVerb]func(context.Context, []byte) []byte{
		verbConversation: q.conversationReply, verbMark: q.markReply,
	}
	// serve answers a query. tenantOf reads the tenant, verb and partition
	// (own: passed on by another instance; -1 otherwise) from the subject.
	serve := func(m *nats.Msg, tenant string, verb schema.QueryVerb, own bool) {
		h := handlers[verb]
		if own && h == nil {
			h = internal[verb]
		}
		if !SafeReply(m.Reply) {
			// Defence in depth: a forged reply subject could make the
			// service write into a stream, a bucket or another
			// conversation's events. Nothing is sent.
			q.logger.Warn("query refused: reply subject outside an inbox", "subject", m.Subject, "reply", m.Reply)
			q.metrics.Inc("ctxpipe_queries_refused_total", "")
			return
		}
		if h == nil || tenant != "" && !schema.ValidTenant(tenant) {
			// Only the server's mappings put a tenant here; a token
			// no tenant may have never names a conversation key.
			_ = m.Respond(schema.MarshalQueryError(schema.QueryBadRequest, "no such tenant"))
			return
		}
		if !shares.take(tenant) {
			q.metrics.Inc("ctxpipe_queries_refused_total", "")
			_ = m.Respond(schema.MarshalQueryError(schema.QueryTimeout, "too many queries in flight from this tenant; retry"))
			return
		}
		select {
		case inflight <- struct{}{}:
		default:
			shares.give(tenant)
			q.metrics.Inc("ctxpipe_queries_refused_total", "")
			_ = m.Respond(schema.MarshalQueryError(schema.QueryTimeout, "too many queries in flight; retry"))
			return
		}
		go func() {
			defer func() { <-inflight; shares.give(tenant) }()
			var reply []byte
			if rt, ok := routeOf(tenant, m.Data, q.parts.partitions()); ok && !own && !q.parts.answersHere(rt.partition) {
				// Another instance holds the conversation: its answer.
				reply = q.forward(ctx, nc, ownSubject(rt.partition, tenant, verb), m.Data, rt.wait)
			} else {
				qctx := withQuerySlots(ctx, reads, waits)
				if tenant != "" {
					qctx = context.WithValue(qctx, tenantKey{}, tenant)
				}
				reply = h(qctx, m.Data)
			}
			if err := m.Respond(reply); err != nil && !errors.Is(err, nats.ErrMsgNoReply) {
				q.logger.Warn("query reply failed", "subject", m.Subject, "err", err)
			}
		}()
	}
	q.metrics.Help("ctxpipe_queries_refused_total", "Queries refused: a reply subject outside an inbox prefix, or too many in flight.")
	q.metrics.Help("ctxpipe_queries_forwarded_total", "Queries passed on to the instances holding their conversation's partition.")
	// Each query on the service's own subject (clients in its account) and
	// on the tenants' (ctx.q.<tenant>.<verb>, mapped there by the server:
	// the tenant comes from the subject, never from the body).
	var subs []*nats.Subscription
	own := &owned{nc: nc, subs: map[int]*nats.Subscription{}, handler: func(m *nats.Msg) {
		_, tenant, verb, ok := parseOwnSubject(m.Subject)
		if !ok {
			return
		}
		serve(m, tenant, verb, true)
	}}
	list, err := q.serveList(ctx, nc)
	if err != nil {
		return nil, err
	}
	subs = append(subs, list)
	drain := func() error {
		errs := []error{own.stop()}
		for _, s := range subs {
			errs = append(errs, s.Drain())
		}
		return errors.Join(errs...)
	}
	for verb := range handlers {
		for _, subject := range []string{schema.QuerySubject("", verb), schema.QuerySubject("*", verb)} {
			sub, err := nc.QueueSubscribe(subject, bus.QueueGroup, func(m *nats.Msg) {
				serve(m, tenantOf(m.Subject), verb, false)
			})
			if err != nil {
				_ = drain()
				return nil, err
			}
			subs = append(subs, sub)
		}
	}
	q.owned.Store(own)
	q.syncOwned()
	// Answer from the moment this returns: a client asking right after
	// the start must not meet "no responders" because the server has not
	// processed the subscriptions yet.
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		_ = drain()
		return nil, fmt.Errorf("serve queries: %w", err)
	}
	return drain, nil
}

type tenantKey struct{}

// tenantOf is the tenant a query came from: the token between ctx.q. and
// the verb, "" for the service's own account.
func tenantOf(subject string) string {
	rest := strings.TrimPrefix(subject, schema.QuerySubjectPrefix)
	if t, _, ok := strings.Cut(rest, "."); ok {
		return t
	}
	return ""
}

// keyOf is the conversation key of a query for conversation conv.
func keyOf(ctx context.Context, conv string) string {
	t, _ := ctx.Value(tenantKey{}).(string)
	return schema.ConversationKey(t, conv)
}

// SafeReply tells whether the service may publish a reply to subject: only
// to a client inbox (_INBOX..., including per-user prefixes such as
// _INBOX_acme.) or to a reply subject the server made for a cross-account
// request (_R_....). Never into $JS, $KV, ctx.* or any other subject.
func SafeReply(subject string) bool {
	if strings.HasPrefix(subject, "_R_.") {
		return true
	}
	if !strings.HasPrefix(subject, "_INBOX") {
		return false
	}
	rest := subject[len("_INBOX"):]
	dot := strings.IndexByte(rest, '.')
	if dot < 0 || dot == len(rest)-1 {
		return false
	}
	// _INBOX.x or _INBOX_<name>.x: the prefix itself holds no dot or wildcard.
	return !strings.ContainsAny(subject, "*> \t")
}

// tenantShares counts each tenant's queries in flight against a bound.
type tenantShares struct {
	mu    sync.Mutex
	bound int
	n     map[string]int
}

func newTenantShares(bound int) *tenantShares {
	return &tenantShares{bound: bound, n: map[string]int{}}
}

func (s *tenantShares) take(tenant string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n[tenant] >= s.bound {
		return false
	}
	s.n[tenant]++
	return true
}

func (s *tenantShares) give(tenant string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n[tenant]--; s.n[tenant] <= 0 {
		delete(s.n, tenant)
	}
}

// querySlots bounds what queries hold: store reads and pending waits.
type querySlots struct{ reads, waits chan struct{} }

type querySlotsKey struct{}

func withQuerySlots(ctx context.Context, reads, waits chan struct{}) context.Context {
	return context.WithValue(ctx, querySlotsKey{}, querySlots{reads, waits})
}

// readSlot takes a store-read slot for the query in ctx; the func gives it
// back. Without slots in ctx (a direct call) it is free.
func readSlot(ctx context.Context) func() {
	s, ok := ctx.Value(querySlotsKey{}).(querySlots)
	if !ok {
		return func() {}
	}
	s.reads <- struct{}{}
	return func() { <-s.reads }
}

// waitSlot takes a wait slot, or reports that too many waits are pending.
func waitSlot(ctx context.Context) (func(), bool) {
	s, ok := ctx.Value(querySlotsKey{}).(querySlots)
	if !ok {
		return func() {}, true
	}
	select {
	case s.waits <- struct{}{}:
		return func() { <-s.waits }, true
	default:
		return nil, false
	}
}

// decodeRequest decodes and validates a query's body; a bad one comes back
// as its error reply.
func decodeRequest[T any, PT interface {
	*T
	Validate() error
}](data []byte) (T, []byte) {
	var req T
	if err := json.Unmarshal(data, &req); err != nil {
		return req, schema.MarshalQueryError(schema.QueryBadRequest, "request is not valid JSON: "+err.Error())
	}
	if err := PT(&req).Validate(); err != nil {
		return req, queryError(err)
	}
	return req, nil
}

// notFound answers not_found when no conversation has key, as for one of
// another tenant; nil when it exists.
func (q *queryServer) notFound(ctx context.Context, key, conv string) []byte {
	_, found, err := q.stores.ForKey(key).State(ctx, key)
	switch {
	case err != nil:
		return queryError(err)
	case !found:
		return queryError(schema.QueryErrorf(schema.QueryNotFound, "no conversation %q", conv))
	}
	return nil
}

func queryError(err error) []byte {
	var qe *schema.QueryErrorBody
	if errors.As(err, &qe) {
		return schema.MarshalQueryError(qe.Code, qe.Message)
	}
	return schema.MarshalQueryError(schema.QueryInternal, err.Error())
}
