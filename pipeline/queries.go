package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/engine"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/store"
)

// defaultWait is how long wait_for waits when the request names no timeout.
const defaultWait = 10 * time.Second

// ServeQueries answers ctx.q.history and ctx.q.status from SQLite in the
// queue group, so each query is answered by one instance. Each request runs
// in its own goroutine. Reading the store is bounded (at most
// maxConcurrent at once); waiting for a wait_for input is not, so any
// number of pending waits never delays a status or history read (the waits
// themselves are capped at maxWaits). The returned func unsubscribes.
func (r *Runner) ServeQueries(ctx context.Context, nc *nats.Conn) (func() error, error) {
	maxConcurrent, maxWaits := r.cfg.MaxQueryReads, r.cfg.MaxQueryWaits
	reads := make(chan struct{}, maxConcurrent)
	waits := make(chan struct{}, maxWaits)
	// Every query in flight, waiting or reading: a flood beyond it is
	// answered at once instead of piling up goroutines.
	inflight := make(chan struct{}, maxConcurrent+maxWaits)
	// A quarter of that per tenant: one tenant holding every slot (65,536
	// waits of a minute each) would have every other tenant's queries
	// refused.
	shares := newTenantShares(max((maxConcurrent+maxWaits)/4, 1))
	r.maxReply = int(nc.MaxPayload())
	handlers := map[schema.QueryVerb]func(context.Context, []byte) []byte{
		schema.VerbHistory: r.History, schema.VerbStatus: r.Status, schema.VerbEvents: r.Events,
	}
	// Asked only by other instances, on ctx.own (browse.go).
	internal := map[schema.QueryVerb]func(context.Context, []byte) []byte{
		verbConversation: r.conversationReply, verbMark: r.markReply,
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
			r.Log.Warn("query refused: reply subject outside an inbox", "subject", m.Subject, "reply", m.Reply)
			r.Metrics.Inc("ctxpipe_queries_refused_total", "")
			return
		}
		if h == nil || tenant != "" && !schema.ValidTenant(tenant) {
			// Only the server's mappings put a tenant here; a token
			// no tenant may have never names a conversation key.
			_ = m.Respond(schema.MarshalQueryError(schema.QueryBadRequest, "no such tenant"))
			return
		}
		if !shares.take(tenant) {
			r.Metrics.Inc("ctxpipe_queries_refused_total", "")
			_ = m.Respond(schema.MarshalQueryError(schema.QueryTimeout, "too many queries in flight from this tenant; retry"))
			return
		}
		select {
		case inflight <- struct{}{}:
		default:
			shares.give(tenant)
			r.Metrics.Inc("ctxpipe_queries_refused_total", "")
			_ = m.Respond(schema.MarshalQueryError(schema.QueryTimeout, "too many queries in flight; retry"))
			return
		}
		go func() {
			defer func() { <-inflight; shares.give(tenant) }()
			var reply []byte
			if rt, ok := routeOf(tenant, m.Data, r.Partitions()); ok && !own && !r.own.answersHere(rt.partition) {
				// Another instance holds the conversation: its answer.
				reply = r.forward(ctx, nc, ownSubject(rt.partition, tenant, verb), m.Data, rt.wait)
			} else {
				qctx := withQuerySlots(ctx, reads, waits)
				if tenant != "" {
					qctx = context.WithValue(qctx, tenantKey{}, tenant)
				}
				reply = h(qctx, m.Data)
			}
			if err := m.Respond(reply); err != nil && !errors.Is(err, nats.ErrMsgNoReply) {
				r.Log.Warn("query reply failed", "subject", m.Subject, "err", err)
			}
		}()
	}
	r.Metrics.Help("ctxpipe_queries_refused_total", "Queries refused: a reply subject outside an inbox prefix, or too many in flight.")
	r.Metrics.Help("ctxpipe_queries_forwarded_total", "Queries passed on to the instances holding their conversation's partition.")
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
	list, err := r.serveList(ctx, nc)
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
	r.owned.Store(own)
	r.syncOwned()
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
func (r *Runner) notFound(ctx context.Context, key, conv string) []byte {
	_, found, err := r.Stores.ForKey(key).State(ctx, key)
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

// History answers a ctx.q.history request.
func (r *Runner) History(ctx context.Context, data []byte) []byte {
	req, bad := decodeRequest[schema.HistoryRequest](data)
	if bad != nil {
		return bad
	}
	key := keyOf(ctx, req.ConversationID)
	if req.WaitFor != "" {
		if err := r.waitFor(ctx, key, req.WaitFor, req.Timeout(defaultWait)); err != nil {
			return queryError(err)
		}
	}
	defer readSlot(ctx)()
	// The effective view reads only what no summary or marker hides:
	// bounded by the context, not by the length of the whole history. An
	// incremental read reads only what was appended.
	h, err := r.Stores.ForKey(key).ReadHistory(ctx, key, req.View == schema.ViewEffective, req.After)
	if err != nil {
		return queryError(err)
	}
	var page historyPage
	if h.Incremental {
		var ok bool
		if page.msgs, ok = appendedView(h, req.View); !ok {
			// A tool result of the appended messages answers a call further
			// back than the tail read: read it all.
			if h, err = r.Stores.ForKey(key).ReadHistory(ctx, key, req.View == schema.ViewEffective, 0); err != nil {
				return queryError(err)
			}
		}
	}
	msgs := h.Messages
	if len(msgs) == 0 && h.Seq == 0 {
		if bad := r.notFound(ctx, key, req.ConversationID); bad != nil {
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
	if r.maxReply > 0 && len(b) > r.maxReply {
		n := max(1, len(page.msgs)*r.maxReply/len(b)/2)
		return queryError(schema.QueryErrorf(schema.QueryTooLarge,
			"the reply is %d bytes (%d messages), over the %d-byte message limit: ask with \"limit\" (about %d fits) and follow next_cursor",
			len(b), len(page.msgs), r.maxReply, n))
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

// waitFor returns once input id of conversation conv is committed, or an
// error on timeout or when the input was rejected. An id committed in
// another conversation does not count: an agent is never told its turn is
// there when it is not. The wait holds no store-read slot.
func (r *Runner) waitFor(ctx context.Context, conv, id string, timeout time.Duration) error {
	answer := func(status store.Status, reason string) error {
		if status == store.StatusRejected {
			return schema.QueryErrorf(schema.QueryInputRejected, "input %s was rejected: %s", id, reason)
		}
		return nil
	}
	check := func() (bool, error) {
		defer readSlot(ctx)()
		status, reason, found, err := r.Stores.ForKey(conv).InputStatusIn(ctx, conv, id)
		if err != nil || !found {
			return false, err
		}
		return true, answer(status, reason)
	}
	release, ok := waitSlot(ctx)
	if !ok {
		// No room to wait: answer only what the store holds already.
		if ok, err := check(); ok || err != nil {
			return err
		}
		return schema.QueryErrorf(schema.QueryTimeout, "too many waits pending; input %s was not awaited", id)
	}
	defer release()
	// Registered before the store is read, so a commit landing in between
	// is not missed; the store is read once, for an input committed before
	// this request came.
	ch, cancel := r.waiters.wait(id)
	defer func() { cancel() }()
	if ok, err := check(); ok || err != nil {
		return err
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case o := <-ch:
			switch {
			case o.known && o.conv == conv:
				return answer(o.status, o.reason)
			case !o.known:
				// A redelivery found stored already: the store says where.
				if ok, err := check(); ok || err != nil {
					return err
				}
			}
			// The id was committed elsewhere (another conversation's input
			// reusing it is rejected there): keep waiting for ours.
			cancel()
			ch, cancel = r.waiters.wait(id)
			if ok, err := check(); ok || err != nil {
				return err
			}
		case <-t.C:
			return schema.QueryErrorf(schema.QueryTimeout, "input %s was not applied within %v", id, timeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Status answers a ctx.q.status request.
func (r *Runner) Status(ctx context.Context, data []byte) []byte {
	req, bad := decodeRequest[schema.StatusRequest](data)
	if bad != nil {
		return bad
	}
	defer readSlot(ctx)()
	key := keyOf(ctx, req.ConversationID)
	st, found, err := r.Stores.ForKey(key).State(ctx, key)
	if err != nil {
		return queryError(err)
	}
	if !found {
		return queryError(schema.QueryErrorf(schema.QueryNotFound, "no conversation %q", req.ConversationID))
	}
	stored, hidden, err := r.Stores.ForKey(key).HiddenCount(ctx, key)
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
		reply.AllowedTokens = int(engine.AllowedTokens(&p))
		reply.Threshold, _ = p.Threshold(r.Engine.Globals.AutoCondensePercent)
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

// Events answers a ctx.q.events request: a conversation's events as
// committed, paged, so a UI or rewind consumer in a tenant account can
// replay them (it cannot read CTX_EVENTS, which lives in the service's
// account).
func (r *Runner) Events(ctx context.Context, data []byte) []byte {
	req, bad := decodeRequest[schema.EventsRequest](data)
	if bad != nil {
		return bad
	}
	defer readSlot(ctx)()
	key := keyOf(ctx, req.ConversationID)
	bodies, more, err := r.Stores.ForKey(key).EventBodies(ctx, key, req.After, req.Limit)
	if err != nil {
		return queryError(err)
	}
	if len(bodies) == 0 && req.After == 0 {
		if bad := r.notFound(ctx, key, req.ConversationID); bad != nil {
			return bad
		}
	}
	rep := schema.EventsReply{ConversationID: req.ConversationID, Events: make([]json.RawMessage, len(bodies)), Next: req.After + len(bodies), More: more}
	size := 0
	for i, b := range bodies {
		rep.Events[i] = b
		size += len(b)
	}
	if r.maxReply > 0 && size > r.maxReply-1024 {
		return queryError(schema.QueryErrorf(schema.QueryTooLarge, "%d events are %d bytes, over the %d-byte message limit: ask with a smaller limit", len(bodies), size, r.maxReply))
	}
	b, err := schema.Marshal(rep)
	if err != nil {
		return queryError(err)
	}
	return b
}
