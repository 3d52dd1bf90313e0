package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/schema"
)

// The event stream (GET /api/events) sends three kinds of Server-Sent
// Events:
//
//   - "ctx": one event from CTX_EVENTS, its JSON as published; the SSE id is
//     its stream sequence, so a browser that reconnects sends it back as
//     Last-Event-ID and resumes right after it, missing nothing and seeing
//     nothing twice.
//   - "changed": the store took inputs since the page's snapshot (turns
//     emit no event, yet move the gauge): read the snapshot again. It has
//     no id, so it leaves the browser's Last-Event-ID alone.
//   - "nats": {"nats": "connected" or why not}, whenever that changes.
//
// Without Last-Event-ID the stream starts after ?after=<seq> (the seq of
// the snapshot the page read), else with the next event published.

// settleAfter is how long after the mark moved a stream looks at it once
// more.
const settleAfter = time.Second

// streamStart is the CTX_EVENTS sequence a stream starts at: after the
// browser's Last-Event-ID, else after ?after, else 0 (the next one
// published).
func streamStart(r *http.Request) (uint64, error) {
	for _, v := range []string{r.Header.Get("Last-Event-ID"), r.URL.Query().Get("after")} {
		if v == "" {
			continue
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("event id %q is not a stream sequence", v)
		}
		return n + 1, nil
	}
	return 0, nil
}

func (h *Dashboard) events(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	key := q.Get("conv")
	filter := schema.EventSubjectPrefix + ">"
	if key != "" {
		if !schema.ValidConversationKey(key) {
			h.fail(w, http.StatusBadRequest, fmt.Errorf("%q is not a conversation key", key))
			return
		}
		// ".*", not ".>": conversation "acme" must not receive tenant
		// acme's conversations' events (ctx.events.acme.<conv>.<type>).
		filter = schema.EventSubjectPrefix + key + ".*"
	}
	start, err := streamStart(r)
	if err != nil {
		h.fail(w, http.StatusBadRequest, err)
		return
	}
	var mark int64 = -1
	if v := q.Get("mark"); v != "" {
		if mark, err = strconv.ParseInt(v, 10, 64); err != nil {
			h.fail(w, http.StatusBadRequest, fmt.Errorf("mark %q is not a number", v))
			return
		}
	}
	flusher, ok := w.(http.Flusher)
	if !ok {
		h.fail(w, http.StatusInternalServerError, errors.New("streaming unsupported by this connection"))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	// The stream's reads and its consumer end with the request or Close.
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	// A browser reconnects a second after the stream breaks.
	fmt.Fprint(w, "retry: 1000\n\n")
	flusher.Flush()

	if start == 0 {
		// A concrete position, so that following again after the
		// connection comes back misses nothing published meanwhile.
		if st, err := h.d.JS.Stream(ctx, bus.StreamEvents); err == nil {
			start = st.CachedInfo().State.LastSeq + 1
		}
	}
	// sent is the sequence of the last event sent. The follower is started
	// again from sent+1 whenever NATS comes back: the ordered consumer
	// recovers by itself, but what reached the client while the link was
	// going down can be lost with the old consumer.
	var sent uint64
	var msgs chan jetstream.Msg
	var stopFollow context.CancelFunc = func() {}
	follow := func() {
		stopFollow()
		var fctx context.Context
		fctx, stopFollow = context.WithCancel(ctx)
		msgs = make(chan jetstream.Msg)
		from := start
		if sent > 0 {
			from = sent + 1
		}
		go h.follow(fctx, filter, from, msgs)
	}
	follow()
	defer func() { stopFollow() }()

	convMark := func() string { return "" }
	if key != "" {
		// A turn of another conversation moves the mark but not this
		// conversation's: its own mark, from the instance holding it, says.
		convMark = func() string {
			m, err := h.d.Source.ConversationMark(ctx, key)
			if err != nil {
				return "?"
			}
			return m
		}
	}
	lastConv := convMark()
	if mark < 0 {
		mark, _ = h.d.Source.Mark(ctx)
	} else {
		lastConv = "" // the page's snapshot is older than now: compare the first time
	}
	nats := ""
	poll := time.NewTicker(h.d.Poll)
	defer poll.Stop()
	ping := time.NewTicker(15 * time.Second)
	defer ping.Stop()
	send := func(event, id string, data []byte) bool {
		if id != "" {
			fmt.Fprintf(w, "id: %s\n", id)
		}
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, data)
		flusher.Flush()
		return ctx.Err() == nil
	}
	// A mark that moved is looked at once more settleAfter later. With
	// several instances the mark is the changelog's, which moves when a
	// commit is appended, a moment before the owner's file holds it: a page
	// that read in between would otherwise wait for the next change.
	var recheck time.Time
	check := func() bool {
		if s := natsState(h.d.JS.Conn()); s != nats {
			if s == "connected" && nats != "" {
				follow()
			}
			nats = s
			b, _ := json.Marshal(map[string]string{"nats": s})
			if !send("nats", "", b) {
				return false
			}
		}
		m, err := h.d.Source.Mark(ctx)
		switch {
		case err != nil:
			return true
		case m != mark:
			mark, recheck = m, time.Now().Add(settleAfter)
		case recheck.IsZero() || time.Now().Before(recheck):
			return true
		default:
			recheck = time.Time{}
		}
		if c := convMark(); key == "" || c != lastConv {
			lastConv = c
			return send("changed", "", []byte("{}"))
		}
		return true
	}
	if !check() {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.done:
			return
		case m := <-msgs:
			md, err := m.Metadata()
			if err != nil || md.Sequence.Stream <= sent {
				continue // sent already, by the follower before this one
			}
			sent = md.Sequence.Stream
			if !send("ctx", strconv.FormatUint(sent, 10), m.Data()) {
				return
			}
		case <-poll.C:
			if !check() {
				return
			}
		case <-ping.C:
			fmt.Fprint(w, ": ping\n\n")
			flusher.Flush()
		}
	}
}

// follow reads CTX_EVENTS from start (0: the next published) through an
// ordered consumer, which re-creates itself after a gap or a reconnect,
// and hands each message to out until ctx ends. While the consumer cannot
// be made (NATS down) it tries again every second; the page is told NATS's
// state by the "nats" events meanwhile.
func (h *Dashboard) follow(ctx context.Context, filter string, start uint64, out chan<- jetstream.Msg) {
	// The server drops the consumer 5 s after the page stops pulling (its
	// default is 5 min: a client opening and closing streams in a loop
	// left dozens of consumers behind).
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}, DeliverPolicy: jetstream.DeliverNewPolicy,
		InactiveThreshold: 5 * time.Second}
	if start > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, start
	}
	var cons jetstream.Consumer
	for {
		var err error
		cons, err = h.d.JS.OrderedConsumer(ctx, bus.StreamEvents, cfg)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		h.d.Log.Debug("dashboard: events consumer not ready", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
	it, err := cons.Messages()
	if err != nil {
		h.d.Log.Warn("dashboard: events consumer", "err", err)
		return
	}
	go func() {
		<-ctx.Done()
		it.Stop()
	}()
	for {
		m, err := it.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) || ctx.Err() != nil {
				return
			}
			// The ordered consumer recovers by itself (a new consumer from
			// the last sequence it delivered); keep reading, without
			// spinning while it cannot.
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		select {
		case out <- m:
		case <-ctx.Done():
			return
		}
	}
}
