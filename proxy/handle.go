package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/ctxpipe/ctxpipe/schema"
)

// mode is what the proxy does with a managed request.
type mode int

const (
	// modeRecord records the new turns, forwards the effective history and
	// records the reply.
	modeRecord mode = iota
	// modeCount forwards the effective history and the turns not recorded
	// yet, and records nothing (count_tokens).
	modeCount
)

// kind is what the client says a request is for.
type kind int

const (
	kindTurn kind = iota
	// kindCompaction is the agent's own compaction: forwarded untouched,
	// recorded.
	kindCompaction
	// kindPassthrough is neither managed nor recorded: Codex's prewarm,
	// a Responses request that continues a stored response.
	kindPassthrough
)

// compactionMarkers are phrases of the agents' own summary prompts (Claude
// Code's, Gemini CLI's) in the last user message.
var compactionMarkers = []string{
	"create a detailed summary of the conversation so far",
	"<state_snapshot>",
}

// requestKind reads what the request is for from Codex's turn metadata
// header, or from a compaction prompt in the last user message.
func requestKind(h http.Header, req *request) kind {
	if req.stateful {
		return kindPassthrough
	}
	if md := h.Get("X-Codex-Turn-Metadata"); md != "" {
		var v struct {
			RequestKind string `json:"request_kind"`
		}
		if json.Unmarshal([]byte(md), &v) != nil {
			v.RequestKind = md
		}
		switch {
		case strings.Contains(v.RequestKind, "prewarm"):
			return kindPassthrough
		case strings.Contains(v.RequestKind, "compaction"):
			return kindCompaction
		}
	}
	low := strings.ToLower(req.lastUserText)
	for _, m := range compactionMarkers {
		if strings.Contains(low, m) {
			return kindCompaction
		}
	}
	return kindTurn
}

// readBody reads a request body of at most limit bytes.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return nil, fmt.Errorf("the request body is larger than this proxy accepts (%d bytes)", limit)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the request body: %v", err)
	}
	return b, nil
}

// managed serves a request of one of the APIs whose history the proxy
// manages.
func (p *Proxy) managed(w http.ResponseWriter, r *http.Request, d dialect, u *Upstream, m mode) {
	ctx := r.Context()
	body, err := readBody(w, r, p.cfg.MaxBodyBytes)
	if err != nil {
		writeError(w, d, http.StatusBadRequest, err.Error())
		return
	}
	switch plain, coded, err := decodeBody(r.Header, body, p.cfg.MaxBodyBytes); {
	case errors.Is(err, errUnknownEncoding):
		p.log.Warn("proxy: forwarding the request unmanaged", "err", err)
		p.forward(w, r, u, d, body, http.Header{"X-Ctxpipe-Managed": {"false"}})
		return
	case err != nil:
		writeError(w, d, http.StatusBadRequest, err.Error())
		return
	case coded:
		// What goes upstream is the decoded body (or one built from it).
		body = plain
		r.Header.Del("Content-Encoding")
	}
	obj, err := parseObject(body)
	if err != nil {
		writeError(w, d, http.StatusBadRequest, err.Error())
		return
	}
	req, err := d.parse(obj)
	if err != nil {
		writeError(w, d, http.StatusBadRequest, err.Error())
		return
	}
	k := requestKind(r.Header, req)
	if k == kindPassthrough || len(req.turns) == 0 {
		p.forward(w, r, u, d, body, nil)
		return
	}
	key, err := requestKey(r.Header, req.keys)
	if err != nil {
		writeError(w, d, http.StatusBadRequest, err.Error())
		return
	}
	if m == modeCount {
		k = kindTurn
	}

	l, err := p.locate(ctx, key, req)
	if err != nil {
		p.unmanaged(w, r, u, d, body, err)
		return
	}
	cv := l.cv
	if m == modeRecord && l.continuesFrom == "" && l.v == extends && len(l.rec.ids) == 0 {
		if from := p.compactedFrom(key, req); from != "" && from != cv.id {
			l.continuesFrom = from
			p.log.Info("proxy: the client's compacted history continues in a new conversation", "from", from, "to", cv.id)
		}
	}
	if l.forkedFrom != "" {
		p.log.Info("proxy: the client's history no longer extends the recorded one; continuing in a new conversation",
			"from", l.forkedFrom, "at_turn", l.forkedAt, "to", cv.id)
	}
	var extra []turnMsg
	last := ""
	switch {
	case l.v != extends:
	case m == modeCount:
		extra = req.turns[l.at:]
	default:
		if last, err = p.publish(ctx, l, key, req); err != nil {
			cv.mu.Unlock()
			var pe *partialError
			if errors.As(err, &pe) {
				p.log.Warn("proxy: the request's new turns were recorded in part; asking the client to send it again", "err", err)
				writeError(w, d, http.StatusServiceUnavailable, "ctxpipe recorded only part of this request's new turns, so it was not sent on: send it again")
				return
			}
			p.unmanaged(w, r, u, d, body, err)
			return
		}
	}
	eff, err := cv.eff.Read(ctx, last)
	cv.mu.Unlock()
	if err != nil {
		p.unmanaged(w, r, u, d, body, err)
		return
	}

	idx := make(map[string]int, len(l.ids))
	for i, id := range l.ids {
		idx[id] = i
	}
	hdr := http.Header{}
	build := func(msgs []schema.Message) []byte {
		if l.v == retried {
			msgs = upTo(msgs, idx)
		}
		ctxTokens, newTokens := 0, 0
		for i := range msgs {
			ctxTokens += msgs[i].Tokens
			if j, ok := idx[msgs[i].ID]; ok && j >= l.at && l.v == extends {
				newTokens += msgs[i].Tokens
			}
		}
		hdr.Set("X-Ctxpipe-Context-Tokens", strconv.Itoa(ctxTokens))
		hdr.Set("X-Ctxpipe-Original-Tokens", strconv.Itoa(l.rec.tokens+newTokens))
		if k == kindCompaction {
			return body
		}
		list := req.spliced(msgs, idx, d.render, extra)
		if req.listIsString || !bytes.Equal(joinArray(list), obj.get(req.list)) {
			return obj.with(req.list, joinArray(list))
		}
		return body
	}
	out := build(eff.Messages)
	hdr.Set("X-Ctxpipe-Conversation", cv.id)
	hdr.Set("X-Ctxpipe-Key-Source", key.Source)
	if key.Parent != "" {
		hdr.Set("X-Ctxpipe-Parent-Conversation", key.Parent)
	}
	if l.continuesFrom != "" {
		hdr.Set("X-Ctxpipe-Forked-From", l.continuesFrom)
	}

	resp, err := p.send(ctx, u, r, out)
	if err != nil {
		p.upstreamFailed(w, d, err)
		return
	}
	if m == modeRecord && k == kindTurn && l.v == extends {
		var over bool
		if resp, over = overflowed(resp); over {
			// The provider says the window is exceeded: reduce by force and
			// try once more with what remains.
			resp.Body.Close()
			if out, err = p.overflow(ctx, cv, build); err != nil {
				p.log.Warn("proxy: the forced reduction failed", "conversation", cv.id, "err", err)
			} else {
				p.log.Info("proxy: context window exceeded; reduced and retried", "conversation", cv.id)
			}
			if resp, err = p.send(ctx, u, r, out); err != nil {
				p.upstreamFailed(w, d, err)
				return
			}
		}
	}
	defer resp.Body.Close()
	keep := 0
	if m == modeRecord && l.v == extends && resp.StatusCode == http.StatusOK {
		keep = p.cfg.MaxReplyBytes
	}
	kept, complete := p.relay(w, resp, hdr, keep)
	if keep == 0 || kept == nil {
		return
	}
	sse := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	t, usage, ok := d.reply(kept, sse)
	switch {
	case !ok && !complete:
		p.log.Warn("proxy: the upstream's reply was cut before its end; not recorded", "conversation", cv.id)
		return
	case !ok:
		p.log.Warn("proxy: the reply holds no assistant message to record", "conversation", cv.id)
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := p.recordReply(rctx, cv, key, len(req.turns), t, usage); err != nil {
		p.log.Warn("proxy: the reply was not recorded", "conversation", cv.id, "err", err)
		return
	}
	if k == kindCompaction {
		p.noteCompaction(key, cv.id, t.content)
	}
}

// overflow sends the conversation an overflow input, waits until it is
// applied, and returns the request rebuilt on the reduced history.
func (p *Proxy) overflow(ctx context.Context, cv *conv, build func([]schema.Message) []byte) ([]byte, error) {
	cv.mu.Lock()
	defer cv.mu.Unlock()
	id, err := p.c.Overflow(ctx, cv.id)
	if err != nil {
		return nil, err
	}
	eff, err := cv.eff.Read(ctx, id)
	if err != nil {
		return nil, err
	}
	return build(eff.Messages), nil
}

// overflowed reads an error reply far enough to tell whether it says the
// context window was exceeded; the response it returns still holds the
// whole body.
func overflowed(resp *http.Response) (*http.Response, bool) {
	if resp.StatusCode != http.StatusBadRequest && resp.StatusCode != http.StatusRequestEntityTooLarge {
		return resp, false
	}
	head, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(head), resp.Body), resp.Body}
	return resp, isOverflow(resp.StatusCode, head)
}

// upTo is the effective history as far as a retried request reaches: up
// to the last message that is one of its turns.
func upTo(msgs []schema.Message, idx map[string]int) []schema.Message {
	end := 0
	for i := range msgs {
		if _, ok := idx[msgs[i].ID]; ok {
			end = i + 1
		}
	}
	return msgs[:end]
}

// forward sends the body as it is and relays the reply, recording nothing.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, u *Upstream, d dialect, body []byte, hdr http.Header) {
	resp, err := p.send(r.Context(), u, r, body)
	if err != nil {
		p.upstreamFailed(w, d, err)
		return
	}
	defer resp.Body.Close()
	p.relay(w, resp, hdr, 0)
}

// unmanaged forwards a request ctxpipe could not take (it is unreachable,
// or refused a turn) as the client sent it: the agent goes on, and the
// turns not recorded are recorded with its next request.
func (p *Proxy) unmanaged(w http.ResponseWriter, r *http.Request, u *Upstream, d dialect, body []byte, err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	p.log.Warn("proxy: forwarding the request unmanaged", "err", err)
	p.forward(w, r, u, d, body, http.Header{"X-Ctxpipe-Managed": {"false"}})
}
