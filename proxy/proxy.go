// Package proxy is ctxpipe behind a base URL: an HTTP server that speaks
// the OpenAI Chat Completions and Responses APIs and the Anthropic
// Messages API to agents, records each request's new turns in ctxpipe as
// any agent would (through package client, with its own NATS credentials),
// forwards the conversation's effective history to the real provider in
// the client's own request, relays the reply unchanged and records it.
//
// Everything the proxy does not manage (tools, system prompts, parameters,
// headers but hop-by-hop and credentials, the reply) passes byte for byte.
package proxy

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/ctxpipe/ctxpipe/client"
)

// Config is what a proxy needs besides its ctxpipe client.
type Config struct {
	// OpenAI serves /v1/chat/completions, /v1/responses and other OpenAI
	// paths; Anthropic serves /v1/messages.
	OpenAI, Anthropic Upstream
	// Secret keys the turn ids: every proxy of a tenant must share it, and
	// keep it, so that a retried request maps to the ids already recorded.
	Secret []byte
	// ProfileID names the profile of the turns ("" for the conversation's,
	// or the service's default).
	ProfileID string
	// MaxBodyBytes bounds a request body (default 32 MiB).
	MaxBodyBytes int64
	// MaxReplyBytes bounds a reply the proxy keeps to record it (default
	// 64 MiB). A larger reply still reaches the client whole; it is not
	// recorded, and the client's next request, which holds it, records it
	// as one of its turns.
	MaxReplyBytes int
	// HeaderTimeout bounds the wait for the upstream's response headers
	// (504 past it; default 10 minutes); IdleTimeout bounds a pause in its
	// body (the reply is cut; default 5 minutes).
	HeaderTimeout, IdleTimeout time.Duration
	// Log gets the proxy's lines (never a key).
	Log *slog.Logger
}

// Proxy is the HTTP handler.
type Proxy struct {
	cfg  Config
	c    *client.Client
	log  *slog.Logger
	http *http.Client
	mux  *http.ServeMux

	mu    sync.Mutex
	convs map[string]*conv
	// compactions are the last compaction reply recorded for each session
	// and agent (links.go).
	compactions map[string]compaction
}

// New returns a proxy that records through c.
func New(c *client.Client, cfg Config) *Proxy {
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 32 << 20
	}
	if cfg.MaxReplyBytes <= 0 {
		cfg.MaxReplyBytes = 64 << 20
	}
	if cfg.HeaderTimeout <= 0 {
		cfg.HeaderTimeout = 10 * time.Minute
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 5 * time.Minute
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.OpenAI.KeyHeader == "" {
		cfg.OpenAI.KeyHeader = "Authorization"
	}
	if cfg.Anthropic.KeyHeader == "" {
		cfg.Anthropic.KeyHeader = "x-api-key"
	}
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ResponseHeaderTimeout: cfg.HeaderTimeout,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   30 * time.Second,
		ForceAttemptHTTP2:     true,
		DisableCompression:    true,
	}
	p := &Proxy{cfg: cfg, c: c, log: cfg.Log, http: &http.Client{Transport: tr},
		convs: map[string]*conv{}, compactions: map[string]compaction{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		p.managed(w, r, chatAPI{}, &p.cfg.OpenAI, modeRecord)
	})
	mux.HandleFunc("POST /v1/messages", func(w http.ResponseWriter, r *http.Request) {
		p.managed(w, r, messagesAPI{}, &p.cfg.Anthropic, modeRecord)
	})
	mux.HandleFunc("POST /v1/messages/count_tokens", func(w http.ResponseWriter, r *http.Request) {
		p.managed(w, r, messagesAPI{}, &p.cfg.Anthropic, modeCount)
	})
	mux.HandleFunc("/v1/responses", func(w http.ResponseWriter, r *http.Request) {
		if isUpgrade(r) {
			// Codex tries a WebSocket first and falls back to HTTP on 426.
			writeError(w, chatAPI{}, http.StatusUpgradeRequired, "this server speaks the Responses API over HTTP only: send the request as a POST")
			return
		}
		if r.Method != http.MethodPost {
			p.passthrough(w, r, p.route(r))
			return
		}
		p.managed(w, r, responsesAPI{}, &p.cfg.OpenAI, modeRecord)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { p.passthrough(w, r, p.route(r)) })
	p.mux = mux
	return p
}

func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.Contains(r.URL.Path, "//") {
		// A base URL given with a trailing slash makes clients ask for
		// /v1//responses: the same path. (ServeMux would answer it with a
		// redirect, which a client turns into a GET or does not follow.)
		for strings.Contains(r.URL.Path, "//") {
			r.URL.Path = strings.ReplaceAll(r.URL.Path, "//", "/")
		}
		r.URL.RawPath = ""
	}
	p.mux.ServeHTTP(w, r)
}

// route picks the upstream of a request the proxy does not manage (GET
// /v1/models, say): Anthropic's when the client speaks Anthropic (its
// version, beta or key header), or asks for a path of Anthropic's outside
// /v1 (Claude Code probes HEAD /api/hello at start), or is Claude Code;
// OpenAI's otherwise.
func (p *Proxy) route(r *http.Request) *Upstream {
	if r.Header.Get("Anthropic-Version") != "" || r.Header.Get("Anthropic-Beta") != "" || r.Header.Get("X-Api-Key") != "" ||
		strings.HasPrefix(r.URL.Path, "/api/") || strings.HasPrefix(r.Header.Get("User-Agent"), "claude-cli/") {
		return &p.cfg.Anthropic
	}
	return &p.cfg.OpenAI
}

// isUpgrade reports a WebSocket handshake.
func isUpgrade(r *http.Request) bool {
	return r.Header.Get("Upgrade") != "" || r.Header.Get("Sec-Websocket-Key") != ""
}

// passthrough forwards a request the proxy does not manage as it is.
func (p *Proxy) passthrough(w http.ResponseWriter, r *http.Request, u *Upstream) {
	var body []byte
	if r.Body != nil {
		b, err := readBody(w, r, p.cfg.MaxBodyBytes)
		if err != nil {
			writeError(w, dialectOf(u, p), http.StatusBadRequest, err.Error())
			return
		}
		body = b
	}
	resp, err := p.send(r.Context(), u, r, body)
	if err != nil {
		p.upstreamFailed(w, dialectOf(u, p), err)
		return
	}
	defer resp.Body.Close()
	p.relay(w, resp, nil, 0)
}

// dialectOf is the error format of an upstream's API.
func dialectOf(u *Upstream, p *Proxy) dialect {
	if u == &p.cfg.Anthropic {
		return messagesAPI{}
	}
	return chatAPI{}
}

// upstreamFailed answers a failure to reach the upstream: 502, or 504
// when it did not answer within the bound.
func (p *Proxy) upstreamFailed(w http.ResponseWriter, d dialect, err error) {
	var ue *upstreamError
	if errors.As(err, &ue) {
		p.log.Warn("proxy: upstream failed", "status", ue.status, "err", ue.err)
		writeError(w, d, ue.status, ue.err.Error())
		return
	}
	if errors.Is(err, context.Canceled) {
		return // the client went away
	}
	writeError(w, d, http.StatusBadGateway, err.Error())
}

// writeError answers with an error in the caller's API format.
func writeError(w http.ResponseWriter, d dialect, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(d.errorBody(status, msg))
}
