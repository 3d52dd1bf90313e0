// Package client is a typed Go client of ctxpipe's wire contract: it
// publishes turns and control inputs to CTX_IN with their dedup ids, asks
// the queries (ctx.q.history, ctx.q.status, ctx.q.events) and follows a
// conversation's events, live and replayed from the start.
//
// An agent's loop:
//
//	c, err := client.Connect(bus.ConnConfig{URL: "nats://127.0.0.1:4222"})
//	...
//	history := c.Track("task-42") // the effective view, read incrementally
//	id, err := c.Append(ctx, schema.Turn{ConversationID: "task-42", Role: schema.RoleUser,
//		Content: schema.TextContent("Why does the build fail?")})
//	h, err := history.Read(ctx, id) // what to send the model, this turn included
//
// A UI's:
//
//	events, err := c.Events(ctx, "task-42", client.Replay(0)) // stored, then live
//	for ev := range events.C() { ... }
//	id, err := c.Condense(ctx, "task-42", "keep the failing test names")
//
// Failures are typed: a query the service refuses is a *QueryError
// carrying the service's code, an input the service rejected is a
// *RejectedError carrying the reason code, and both match sentinels with
// errors.Is (ErrNotFound, ErrTimeout, ErrRejected, ...).
//
// Tenancy needs nothing here: inside a tenant's account a client uses the
// same subjects and the server maps them onto the tenant's. From the
// service's own account, WithTenant reaches one tenant's conversations.
//
// Layering: client sits above schema and bus; cmd/publisher and the proxy
// use it, the dashboard's tests drive the dashboard through it, and the
// service itself never imports it.
package client

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/schema"
)

// DefaultTimeout bounds a call whose context has no deadline: one request,
// one publish, or a wait for an input to be applied.
const DefaultTimeout = 10 * time.Second

// Client talks to ctxpipe over one NATS connection. It is safe for
// concurrent use.
type Client struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	own     bool // Close closes nc: Connect made it
	timeout time.Duration
	tenant  string // "": the subjects as they are in the connection's account
}

// Option configures a Client.
type Option func(*Client)

// WithTimeout replaces DefaultTimeout.
func WithTimeout(d time.Duration) Option {
	return func(c *Client) {
		if d > 0 {
			c.timeout = d
		}
	}
}

// WithTenant addresses tenant's conversations from the service's own
// account, where the server maps each tenant's subjects (ctx.in.<tenant>.
// <conv>.<kind>, ctx.q.<tenant>.<verb>, ctx.events.<tenant>.<conv>.<type>):
// for an operator's tool. A client inside a tenant's account needs no
// option: it uses the plain subjects. An invalid tenant
// makes New fail.
func WithTenant(tenant string) Option {
	return func(c *Client) { c.tenant = tenant }
}

// New returns a client over nc, which stays the caller's: Close leaves it
// open.
func New(nc *nats.Conn, opts ...Option) (*Client, error) {
	if nc == nil {
		return nil, fmt.Errorf("ctxpipe client: nil connection")
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("ctxpipe client: jetstream: %w", err)
	}
	c := &Client{nc: nc, js: js, timeout: DefaultTimeout}
	for _, o := range opts {
		o(c)
	}
	if c.tenant != "" && !schema.ValidTenant(c.tenant) {
		return nil, fmt.Errorf("ctxpipe client: tenant %q must be 1-128 characters of [A-Za-z0-9_-], not starting with _", c.tenant)
	}
	return c, nil
}

// scoped is the subject token(s) of conv: "<tenant>.<conv>" with
// WithTenant, else conv.
func (c *Client) scoped(conv string) string { return schema.ConversationKey(c.tenant, conv) }

// Connect connects with cfg (bus.Connect: credentials, per-user inbox
// prefix, reconnect for ever) and returns a client that owns the
// connection: Close closes it.
func Connect(cfg bus.ConnConfig, opts ...Option) (*Client, error) {
	if cfg.Name == "" {
		cfg.Name = "ctxpipe-client"
	}
	nc, err := bus.Connect(cfg)
	if err != nil {
		return nil, err
	}
	c, err := New(nc, opts...)
	if err != nil {
		nc.Close()
		return nil, err
	}
	c.own = true
	return c, nil
}

// Close closes the connection if Connect made it.
func (c *Client) Close() {
	if c.own {
		c.nc.Close()
	}
}

// bound gives ctx the client's timeout when it has no deadline of its own,
// so that a lost reply or ack never blocks for ever.
func (c *Client) bound(ctx context.Context, extra time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, c.timeout+extra)
}
