package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/schema"
)

// A query reaches any instance (the queue group); only the instances that
// hold its conversation's partition can answer it. Any other passes it on
// over the service account's own subject ctx.own.<p>.<tenant>.<verb>,
// which the holders of partition p serve in the queue group, and relays the
// answer. Only instances of the service publish there (no tenant's account
// has a subject that leads to it), so the tenant token it carries is the one
// the server's mapping put in the query's subject.

// ownPrefix starts the subjects queries are passed on to.
const ownPrefix = "ctx.own."

// noTenant stands for the service's own account in an ctx.own subject (a
// tenant id is never "_").
const noTenant = "_"

// ownSubject is where a query of tenant about a conversation of partition
// p is passed on to.
func ownSubject(p int, tenant string, verb schema.QueryVerb) string {
	if tenant == "" {
		tenant = noTenant
	}
	return ownPrefix + strconv.Itoa(p) + "." + tenant + "." + string(verb)
}

// parseOwnSubject reads ctx.own.<p>.<tenant>.<verb>.
func parseOwnSubject(subject string) (p int, tenant string, verb schema.QueryVerb, ok bool) {
	rest, found := strings.CutPrefix(subject, ownPrefix)
	if !found {
		return 0, "", "", false
	}
	toks := strings.Split(rest, ".")
	if len(toks) != 3 {
		return 0, "", "", false
	}
	p, err := strconv.Atoi(toks[0])
	if err != nil || p < 0 {
		return 0, "", "", false
	}
	tenant = toks[1]
	if tenant == noTenant {
		tenant = ""
	}
	return p, tenant, schema.QueryVerb(toks[2]), true
}

// queryRoute is where a query goes: its partition, and how long an answer
// may take (a wait_for's timeout).
type queryRoute struct {
	partition int
	wait      time.Duration
}

// routeOf reads a query's conversation and wait from its body; ok is false
// when the body does not name a conversation (the local answer says why).
func routeOf(tenant string, data []byte, partitions int) (queryRoute, bool) {
	var req schema.HistoryRequest
	if json.Unmarshal(data, &req) != nil || req.ConversationID == "" || strings.ContainsAny(req.ConversationID, ". *>") {
		return queryRoute{}, false
	}
	rt := queryRoute{partition: bus.PartitionOf(tenant, req.ConversationID, partitions)}
	if req.WaitFor != "" && req.TimeoutMS >= 0 {
		rt.wait = req.Timeout(defaultWait)
	}
	return rt, true
}

// forwardWithin bounds how long a query is retried while no instance serves
// its partition (the owner died and the next has not restored it yet).
const forwardWithin = 5 * time.Second

// forward passes a query on to the holders of its partition and returns
// their answer.
func (q *queryServer) forward(ctx context.Context, nc *nats.Conn, subject string, data []byte, wait time.Duration) []byte {
	q.metrics.Inc("ctxpipe_queries_forwarded_total", "")
	until := time.Now().Add(forwardWithin)
	for {
		rctx, cancel := context.WithTimeout(ctx, wait+forwardWithin)
		msg, err := nc.RequestWithContext(rctx, subject, data)
		cancel()
		switch {
		case err == nil:
			return msg.Data
		case errors.Is(err, nats.ErrNoResponders) && time.Now().Before(until) && ctx.Err() == nil:
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
			continue
		case errors.Is(err, nats.ErrNoResponders):
			return schema.MarshalQueryError(schema.QueryTimeout, "no instance holds this conversation's partition now (an instance is taking it over); retry")
		}
		return schema.MarshalQueryError(schema.QueryTimeout, "the instance holding this conversation did not answer: "+err.Error()+"; retry")
	}
}

// owned keeps this instance's subscriptions to ctx.own.<p>.*.* for the
// partitions it owns.
type owned struct {
	nc      *nats.Conn
	handler nats.MsgHandler

	mu   sync.Mutex
	subs map[int]*nats.Subscription
	done bool
}

// sync subscribes to the partitions in serve and drains the others.
func (o *owned) sync(serve func(p int) bool, n int, log func(msg string, args ...any)) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.done {
		return
	}
	for p := 0; p < n; p++ {
		sub, has := o.subs[p]
		switch want := serve(p); {
		case want && !has:
			s, err := o.nc.QueueSubscribe(ownPrefix+strconv.Itoa(p)+".*.*", bus.QueueGroup, o.handler)
			if err != nil {
				log("cannot serve the partition's queries; others answer them locally", "partition", p, "err", err)
				continue
			}
			o.subs[p] = s
		case !want && has:
			_ = sub.Drain()
			delete(o.subs, p)
		}
	}
}

// stop drains every subscription; sync does nothing after it.
func (o *owned) stop() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.done = true
	var errs []error
	for p, s := range o.subs {
		errs = append(errs, s.Drain())
		delete(o.subs, p)
	}
	return errors.Join(errs...)
}

// syncOwned brings the ctx.own subscriptions in line with the partitions
// owned.
func (q *queryServer) syncOwned() {
	o, n := q.owned.Load(), q.parts.partitions()
	if o == nil || n == 0 {
		return
	}
	o.sync(q.parts.answersHere, n+1, q.logger.Warn)
}
