package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/engine"
	"github.com/ctxpipe/ctxpipe/pipeline"
	"github.com/ctxpipe/ctxpipe/schema"
)

// Row is one conversation as the pages show it.
type Row struct {
	Key            string  `json:"key"`    // <tenant>.<conv> or <conv>: the id in the page's URL
	Tenant         string  `json:"tenant"` // "" for the service's own account
	ID             string  `json:"id"`     // the conversation id as its agents know it
	Profile        string  `json:"profile"`
	Tokens         int     `json:"tokens"`
	Window         int     `json:"window"`           // 0 when the profile is unknown
	Allowed        int     `json:"allowed"`          // above it the service truncates
	Threshold      int     `json:"threshold"`        // percent of the window
	ThresholdToken int     `json:"threshold_tokens"` // the same in tokens
	Percent        float64 `json:"percent"`
	Messages       int     `json:"messages"` // stored, hidden ones included
	Hidden         int     `json:"hidden"`
	Condenses      int     `json:"condenses"`
	Truncations    int     `json:"truncations"`
	UpdatedAt      int64   `json:"updated_at"` // Unix ms of its last change
}

// Live is what a page needs to follow a snapshot without a gap: where in
// CTX_EVENTS and in the inputs it was read.
type Live struct {
	// Seq is CTX_EVENTS's last sequence read before the store was: every
	// event at or below it is in the snapshot (the relay publishes only
	// committed events), so the page's event stream starts after it.
	Seq uint64 `json:"seq"`
	// Mark is the store's input mark (store.InputMark) read before the
	// snapshot: the event stream says "changed" once it moves.
	Mark int64 `json:"mark"`
	// NATS is "connected", or why not ("disconnected: ...").
	NATS string `json:"nats"`
}

type listReply struct {
	Live
	Conversations []Row `json:"conversations"`
	// MissingPartitions are the partitions whose conversations are not
	// listed: no instance answered for them in time (one taking another's
	// over). Truncated says an instance had more conversations than one
	// answer carries, and sent its most recently changed.
	MissingPartitions []int `json:"missing_partitions,omitempty"`
	Truncated         bool  `json:"truncated,omitempty"`
}

// row computes a conversation's figures as ctx.q.status does.
func (h *Dashboard) row(key string, st schema.ConversationState, stored, hidden int, updated int64) Row {
	tenant, id := schema.SplitKey(key)
	r := Row{Key: key, Tenant: tenant, ID: id, Profile: st.ProfileID, Tokens: st.ContextTokens,
		Messages: stored, Hidden: hidden, Condenses: st.Condensations, Truncations: st.Truncations, UpdatedAt: updated}
	pid := st.ProfileID
	if pid == "" {
		pid = schema.DefaultProfileID
	}
	if p, ok := h.d.Profiles.Get(pid); ok {
		r.Window = p.ContextWindow
		r.Allowed = int(engine.AllowedTokens(&p))
		r.Threshold, _ = p.Threshold(h.d.Globals.AutoCondensePercent)
		r.ThresholdToken = p.ContextWindow * r.Threshold / 100
		if p.ContextWindow > 0 {
			r.Percent = float64(int(10000*float64(st.ContextTokens)/float64(p.ContextWindow))) / 100
		}
	}
	return r
}

// live reads the stream position and the input mark, in that order, before
// the caller reads the store. With NATS down the snapshot is still served,
// from SQLite, and the page says live updates wait for NATS.
func (h *Dashboard) live(ctx context.Context) Live {
	l := Live{NATS: natsState(h.d.JS.Conn())}
	if l.NATS == "connected" {
		ictx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		// Stream asks the server for the stream's info once; CachedInfo
		// is that answer.
		s, err := h.d.JS.Stream(ictx, bus.StreamEvents)
		if err == nil {
			l.Seq = s.CachedInfo().State.LastSeq
		}
		if err != nil {
			l.NATS = "unavailable: " + err.Error()
		}
	}
	mark, err := h.d.Source.Mark(ctx)
	if err == nil {
		l.Mark = mark
	}
	return l
}

func natsState(nc *nats.Conn) string {
	switch st := nc.Status(); st {
	case nats.CONNECTED:
		return "connected"
	default:
		if err := nc.LastError(); err != nil {
			return st.String() + ": " + err.Error()
		}
		return st.String()
	}
}

func (h *Dashboard) listConversations(w http.ResponseWriter, r *http.Request) {
	rep := listReply{Live: h.live(r.Context()), Conversations: []Row{}}
	list, err := h.d.Source.Conversations(r.Context())
	if err != nil {
		h.fail(w, http.StatusInternalServerError, err)
		return
	}
	for _, c := range list.Conversations {
		rep.Conversations = append(rep.Conversations, h.row(c.Key, c.State, c.Stored, c.Hidden, c.UpdatedAt))
	}
	rep.MissingPartitions, rep.Truncated = list.Missing, list.Truncated
	writeJSON(w, http.StatusOK, rep)
}

// convReply is one conversation's snapshot.
type convReply struct {
	Live
	Row
	History []HistoryItem     `json:"history"` // the full history, position order
	Events  []json.RawMessage `json:"events"`  // every event, commit order
	Series  []Point           `json:"series"`  // the plot's points
}

func (h *Dashboard) conversation(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	if !schema.ValidConversationKey(key) {
		h.fail(w, http.StatusBadRequest, fmt.Errorf("%q is not a conversation key (<conv> or <tenant>.<conv>)", key))
		return
	}
	ctx := r.Context()
	live := h.live(ctx)
	v, err := h.d.Source.Conversation(ctx, key)
	if h.failedLookup(w, key, err) {
		return
	}
	events := make([]schema.Event, 0, len(v.Events))
	for _, raw := range v.Events {
		e, err := schema.DecodeEvent(raw)
		if err != nil {
			h.fail(w, http.StatusInternalServerError, fmt.Errorf("an event of %q: %w", key, err))
			return
		}
		events = append(events, e)
	}
	items, hidden := History(v.Messages)
	rep := convReply{Live: live, Row: h.row(key, v.State, len(v.Messages), hidden, v.UpdatedAt),
		History: items, Events: v.Events, Series: Series(v.Messages, events)}
	writeJSON(w, http.StatusOK, rep)
}

// failedLookup answers a failed read of conversation key: 404 when there
// is no such conversation, 500 for any other failure. It tells whether it
// answered.
func (h *Dashboard) failedLookup(w http.ResponseWriter, key string, err error) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, pipeline.ErrNoConversation):
		h.fail(w, http.StatusNotFound, fmt.Errorf("no conversation %q", key))
	default:
		h.fail(w, http.StatusInternalServerError, err)
	}
	return true
}

// controlRequest is the body of a control POST; a condense needs none.
type controlRequest struct {
	TS            int64  `json:"ts"`             // rewind: the cutoff, a stored message's ts
	IncludeTarget bool   `json:"include_target"` // rewind: keep the message at ts
	Instructions  string `json:"instructions"`   // condense: for the summarizer, optional
}

// control publishes a condense or rewind for the conversation in the path,
// on ctx.in.<key>.<kind>, and answers the input's id once CTX_IN stored it;
// the outcome arrives as events.
func (h *Dashboard) control(kind schema.InputKind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key := r.PathValue("key")
		if !schema.ValidConversationKey(key) {
			h.fail(w, http.StatusBadRequest, fmt.Errorf("%q is not a conversation key", key))
			return
		}
		if err := sameOrigin(r); err != nil {
			h.fail(w, http.StatusForbidden, err)
			return
		}
		var req controlRequest
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			h.fail(w, http.StatusBadRequest, fmt.Errorf("body: %w", err))
			return
		}
		if _, err := dec.Token(); err != io.EOF {
			h.fail(w, http.StatusBadRequest, errors.New("body: one JSON object, and nothing after it"))
			return
		}
		if n := utf8.RuneCountInString(req.Instructions); n > schema.MaxInstructionsLen {
			h.fail(w, http.StatusBadRequest, fmt.Errorf("instructions of %d characters; at most %d", n, schema.MaxInstructionsLen))
			return
		}
		_, err := h.d.Source.ConversationMark(r.Context(), key)
		if h.failedLookup(w, key, err) {
			return
		}
		_, conv := schema.SplitKey(key)
		// The payload names the conversation as its tenant's clients know
		// it; the tenant is in the subject only (schema.DecodeInput).
		in := schema.Input{Kind: kind, ID: uuid.NewString(), ConversationID: conv, TS: time.Now().UnixMilli()}
		switch kind {
		case schema.KindCondense:
			in.Trigger, in.Instructions = schema.TriggerManual, req.Instructions
		case schema.KindRewind:
			if req.TS <= 0 {
				h.fail(w, http.StatusBadRequest, errors.New("a rewind needs ts: the ts of a stored message (Unix ms)"))
				return
			}
			in.TS, in.IncludeTarget = req.TS, req.IncludeTarget
		}
		data, err := schema.ControlPayload(in)
		if err != nil {
			h.fail(w, http.StatusBadRequest, err)
			return
		}
		if s := natsState(h.d.JS.Conn()); s != "connected" {
			h.fail(w, http.StatusServiceUnavailable, fmt.Errorf("NATS is %s: the %s was not sent", s, kind))
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		subject := schema.InputSubjectPrefix + key + "." + string(kind)
		if _, err := bus.PublishInput(ctx, h.d.JS, subject, in.ID, data); err != nil {
			h.fail(w, http.StatusServiceUnavailable, err)
			return
		}
		h.d.Log.Info("dashboard: control input published", "subject", subject, "input", in.ID)
		writeJSON(w, http.StatusAccepted, map[string]string{"input_id": in.ID, "subject": subject})
	}
}

// sameOrigin refuses what another site's page could send: a body that is
// not JSON (a form needs no preflight) or a request from another origin.
func sameOrigin(r *http.Request) error {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "application/json" {
		return errors.New("a control request must be application/json")
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			return fmt.Errorf("origin %q is not this dashboard's", o)
		}
	}
	return nil
}

// apiError is every failed API call's body.
type apiError struct {
	Error string `json:"error"`
}

func (h *Dashboard) fail(w http.ResponseWriter, status int, err error) {
	if status >= 500 {
		h.d.Log.Warn("dashboard request failed", "status", status, "err", err)
	}
	writeJSON(w, status, apiError{Error: err.Error()})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := schema.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":"encoding the reply failed"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
