// Package dashboard is ctxpipe's live dashboard: a conversations page (every
// conversation with its context gauge) and a page per conversation (the
// context-size plot, the event timeline, the history with what each summary
// or truncation marker hides, and buttons to condense now and to rewind).
// The pages are plain HTML, CSS and JavaScript embedded in the binary (no
// build step, nothing fetched from a CDN: the machines it runs on may have
// no internet), kept live over Server-Sent Events fed by CTX_EVENTS.
//
// cmd/consumer mounts it at / on its HTTP address, beside /metrics and
// /healthz (the more specific patterns keep winning):
//
//	d, err := dashboard.New(dashboard.Deps{Store: m.store, JS: js,
//		Source: pipeline.Browser{R: runner, NC: nc},
//		Profiles: profiles, Globals: c.Globals, Log: log})
//	mux.Handle("/", d)
//	m.http.RegisterOnShutdown(d.Close) // open event streams end on Shutdown
//
// The server must have no WriteTimeout: event streams stay open.
//
// Whose credentials. The dashboard runs inside the service and acts with the
// service's own NATS connection, in the service's account: it reads the
// conversations through the service's instances (Deps.Source; each holds
// its own partitions' conversations) and CTX_EVENTS directly, sees every
// tenant's conversations (the tenant is a column: conversation keys are
// <tenant>.<conv>, schema.SplitKey), and
// publishes the condense and rewind it is asked for on
// ctx.in.<tenant>.<conv>.<kind>, exactly where the server maps a tenant's
// own input. It does not log the browser user in as NATS's "ui" user: the
// browser holds no NATS credentials, and whoever can reach the HTTP
// listener can condense and rewind any conversation. That listener is
// loopback by default (127.0.0.1:9464, --http); expose it only behind
// something that authenticates. Two guards keep another web site from
// driving a browser on the same machine against it: a control request must
// be JSON (which a cross-site form cannot send without a CORS preflight the
// dashboard never grants) and a cross-origin Origin is refused. A third
// keeps a site from rebinding its own name to this machine's loopback
// address, which would make its page same-origin with the dashboard: a
// request must name the dashboard by an IP address, localhost, or one of
// the names the operator gives it (Deps.Hosts, --http-hosts).
package dashboard

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/pipeline"
	"github.com/ctxpipe/ctxpipe/schema"
)

// Reader is what the dashboard reads of the store: what the pipeline's
// readers of conversations read.
type Reader = pipeline.ConversationReader

//go:embed static
var staticFiles embed.FS

// Deps is what the dashboard reads and acts through; all of it is the
// service's own.
type Deps struct {
	// Store is read for the conversations, their histories, states and
	// events when Source is nil: a *store.Store, or the *store.Set of an
	// instance whose state is split over files.
	Store Reader
	// Source is where conversations are read: pipeline.Browser reads
	// every instance's (a list gathered from all of them, a conversation
	// from its partition's owner). Nil: pipeline.StoreBrowser over Store.
	Source Source
	// JS reads CTX_EVENTS (an ordered consumer per open page) and publishes
	// control inputs to CTX_IN (bus.PublishInput). Its connection's status
	// is what the pages show as "NATS down".
	JS jetstream.JetStream
	// Profiles give each conversation its window, allowed size and
	// threshold.
	Profiles *pipeline.Profiles
	// Globals are the service's defaults (the global condense percent, for
	// profiles that inherit it).
	Globals schema.Globals
	// Log receives the dashboard's failures (nil: discarded).
	Log *slog.Logger
	// Poll is how often an open page's event stream checks the store for
	// new turns, which emit no event (0: 300 ms).
	Poll time.Duration
	// Hosts are the names, besides IP addresses and localhost, that a
	// request may call the dashboard by (its Host header); any other is
	// refused (see the package comment).
	Hosts []string
}

// Source is where the dashboard reads conversations (pipeline.Browser,
// pipeline.StoreBrowser).
type Source interface {
	// Conversations lists the conversations, saying which partitions'
	// are missing (no instance answered for them in time).
	Conversations(ctx context.Context) (pipeline.ConversationList, error)
	// Conversation reads one; pipeline.ErrNoConversation when none is
	// stored.
	Conversation(ctx context.Context, key string) (pipeline.ConversationView, error)
	// ConversationMark changes whenever conversation key does
	// (pipeline.ErrNoConversation when none is stored).
	ConversationMark(ctx context.Context, key string) (string, error)
	// Mark moves whenever any conversation may have changed.
	Mark(ctx context.Context) (int64, error)
}

// Dashboard serves the pages, the JSON API and the event streams.
type Dashboard struct {
	d         Deps
	mux       *http.ServeMux
	done      chan struct{} // closed by Close: every event stream ends
	closeOnce sync.Once
}

// Close ends every open event stream (browsers reconnect on their own, to
// whatever serves next) and makes new ones end at once. http.Server's
// Shutdown does not cancel running requests, so an open page would hold
// it until its deadline: register Close with the server's
// RegisterOnShutdown.
func (h *Dashboard) Close() { h.closeOnce.Do(func() { close(h.done) }) }

// New returns the dashboard's handler, to be mounted at /:
//
//	GET  /                                    conversations page
//	GET  /c/{key}                             one conversation's page
//	GET  /static/...                          the embedded CSS and JavaScript
//	GET  /api/conversations                   every conversation with its status
//	GET  /api/conversations/{key}             status, full history, events, plot series
//	POST /api/conversations/{key}/condense    publish a manual condense
//	POST /api/conversations/{key}/rewind      publish a rewind {"ts","include_target"}
//	GET  /api/events[?conv=key&after=seq]     Server-Sent Events from CTX_EVENTS
func New(d Deps) (*Dashboard, error) {
	if d.Store == nil && d.Source == nil || d.JS == nil || d.Profiles == nil {
		return nil, errors.New("dashboard: Store (or Source), JS and Profiles are required")
	}
	if d.Source == nil {
		d.Source = pipeline.StoreBrowser{Store: d.Store}
	}
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	if d.Poll <= 0 {
		d.Poll = 300 * time.Millisecond
	}
	if d.Globals.AutoCondensePercent == 0 {
		d.Globals = schema.DefaultGlobals()
	}
	static, err := fs.Sub(staticFiles, "static")
	if err != nil {
		return nil, err
	}
	h := &Dashboard{d: d, mux: http.NewServeMux(), done: make(chan struct{})}
	page := func(name string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Cache-Control", "no-cache")
			http.ServeFileFS(w, r, static, name)
		}
	}
	h.mux.HandleFunc("GET /{$}", page("index.html"))
	h.mux.HandleFunc("GET /c/{key}", page("conversation.html"))
	h.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	h.mux.HandleFunc("GET /api/conversations", h.listConversations)
	h.mux.HandleFunc("GET /api/conversations/{key}", h.conversation)
	h.mux.HandleFunc("POST /api/conversations/{key}/condense", h.control(schema.KindCondense))
	h.mux.HandleFunc("POST /api/conversations/{key}/rewind", h.control(schema.KindRewind))
	h.mux.HandleFunc("GET /api/events", h.events)
	return h, nil
}

// ServeHTTP serves the pages, the API and the event streams. Every response
// forbids framing and sniffing: the pages show agents' text.
func (h *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; frame-ancestors 'none'")
	if h.refused(w, r) {
		return
	}
	h.mux.ServeHTTP(w, r)
}

// Guard serves next only to requests that name this dashboard by one of
// its names (see knownHost), and 421 to others: the service puts /metrics
// and /debug/pprof/ behind it too, which a rebinding site's page could
// otherwise read.
func (h *Dashboard) Guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !h.refused(w, r) {
			next.ServeHTTP(w, r)
		}
	})
}

// refused answers 421 to a request whose Host is not one of this
// service's names, and says whether it did.
func (h *Dashboard) refused(w http.ResponseWriter, r *http.Request) bool {
	if h.knownHost(r.Host) {
		return false
	}
	writeJSON(w, http.StatusMisdirectedRequest, apiError{Error: fmt.Sprintf(
		"host %q is not a name of this service: use its address, localhost, or a name given with --http-hosts", r.Host)})
	return true
}

// knownHost tells whether a request's Host names this dashboard: an IP
// address (a rebinding site has a name, not an address), localhost or a
// name under it (browsers resolve those to loopback themselves), or one of
// Deps.Hosts.
func (h *Dashboard) knownHost(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport // no port
	}
	host = strings.ToLower(strings.TrimSuffix(strings.Trim(host, "[]"), "."))
	if host == "" {
		return false
	}
	if net.ParseIP(host) != nil || host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	for _, name := range h.d.Hosts {
		if strings.EqualFold(strings.TrimSuffix(name, "."), host) {
			return true
		}
	}
	return false
}
