package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/ctxpipe/ctxpipe/client"
	"github.com/ctxpipe/ctxpipe/internal/quality"
	"github.com/ctxpipe/ctxpipe/schema"
)

// This file replays the shared agent runs through the proxy, as an agent
// speaking the Messages API would: each request holds the transcript's
// turns so far, and the upstream answers with the transcript's next
// assistant turn. The benchmarks (bench_test.go) and tests use it.

// Headers the replaying client sets for the replay upstream; the proxy
// passes them through like any header it does not manage.
const (
	hdrReplayConv   = "X-Replay-Transcript"
	hdrReplayTurn   = "X-Replay-Turn"
	hdrReplayStream = "X-Replay-Stream"
	hdrReplayKeep   = "X-Replay-Keep"
)

// replayModel is an upstream speaking the Messages API that answers a
// request of a replayed transcript with that transcript's assistant turn
// named in the request's headers. Its usage reports input tokens as a
// quarter of the bytes it received (what it received, not what the client
// sent). It keeps the last body of each transcript that asked to be kept.
type replayModel struct {
	srv     *httptest.Server
	replies map[string][]jsontext.Value // transcript → turn index → content blocks (nil for user turns)

	mu   sync.Mutex
	kept map[string][]byte
}

func newReplayModel(tb testing.TB, ts []quality.Transcript) *replayModel {
	m := &replayModel{replies: map[string][]jsontext.Value{}, kept: map[string][]byte{}}
	for _, t := range ts {
		r := make([]jsontext.Value, len(t.Turns))
		for i := range t.Turns {
			if t.Turns[i].Role == schema.RoleAssistant {
				r[i] = replayBlocks(t.Name, i, t.Turns[i].Content)
			}
		}
		m.replies[t.Name] = r
	}
	m.srv = httptest.NewServer(http.HandlerFunc(m.serve))
	tb.Cleanup(m.srv.Close)
	return m
}

// take returns the last body kept for transcript name.
func (m *replayModel) take(name string) []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.kept[name]
	delete(m.kept, name)
	return b
}

func (m *replayModel) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	name := r.Header.Get(hdrReplayConv)
	k, _ := strconv.Atoi(r.Header.Get(hdrReplayTurn))
	rs := m.replies[name]
	if r.URL.Path != "/v1/messages" || k < 0 || k >= len(rs) || rs[k] == nil {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"type":"error","error":{"type":"not_found_error","message":"no turn %d of %q"}}`, k, name)
		return
	}
	if r.Header.Get(hdrReplayKeep) != "" {
		m.mu.Lock()
		m.kept[name] = body
		m.mu.Unlock()
	}
	a := replayAnswer{id: fmt.Sprintf("msg_%d", k), blocks: rs[k], in: len(body)/4 + 1, out: len(rs[k])/4 + 1}
	if r.Header.Get(hdrReplayStream) != "" {
		a.stream(w)
	} else {
		a.json(w)
	}
}

// replayBlocks is an assistant turn's content as Messages API blocks:
// reasoning as signed thinking (the signature made up, but the same each
// time), text, tool calls.
func replayBlocks(name string, i int, c schema.Content) jsontext.Value {
	var out []map[string]any
	for _, b := range c.BlocksOf() {
		switch b.Type {
		case schema.BlockReasoning:
			out = append(out, map[string]any{"type": "thinking", "thinking": b.Text, "signature": fmt.Sprintf("sig/%s/%d", name, i)})
		case schema.BlockText:
			if b.Text != "" {
				out = append(out, map[string]any{"type": "text", "text": b.Text})
			}
		case schema.BlockToolUse:
			out = append(out, map[string]any{"type": "tool_use", "id": b.ID, "name": b.Name, "input": b.Input})
		}
	}
	return marshal(out)
}

// replayUser is a user turn as a Messages API message.
func replayUser(c schema.Content) jsontext.Value {
	if !c.IsBlocks {
		return marshal(map[string]any{"role": "user", "content": c.Text})
	}
	var out []map[string]any
	for _, b := range c.Blocks {
		switch b.Type {
		case schema.BlockText:
			out = append(out, map[string]any{"type": "text", "text": b.Text})
		case schema.BlockToolResult:
			out = append(out, anthToolResult(b))
		}
	}
	return marshal(map[string]any{"role": "user", "content": out})
}

// replayAnswer is one reply of the replay upstream.
type replayAnswer struct {
	id      string
	blocks  jsontext.Value
	in, out int
}

func (a replayAnswer) stop() string {
	if bytes.Contains(a.blocks, []byte(`"type":"tool_use"`)) {
		return "tool_use"
	}
	return "end_turn"
}

func (a replayAnswer) json(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":%q,"type":"message","role":"assistant","model":"replay","content":%s,"stop_reason":%q,"stop_sequence":null,`+
		`"usage":{"input_tokens":%d,"output_tokens":%d,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}`,
		a.id, a.blocks, a.stop(), a.in, a.out)
}

func (a replayAnswer) stream(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/event-stream")
	sse(w, "message_start", fmt.Sprintf(`{"type":"message_start","message":{"id":%q,"type":"message","role":"assistant","model":"replay","content":[],`+
		`"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":%d,"output_tokens":1,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}}`, a.id, a.in))
	blocks, _ := splitArray(a.blocks)
	for i, raw := range blocks {
		var b anthBlock
		_ = json.Unmarshal(raw, &b)
		switch b.Type {
		case "thinking":
			sse(w, "content_block_start", fmt.Sprintf(`{"type":"content_block_start","index":%d,"content_block":{"type":"thinking","thinking":"","signature":""}}`, i))
			sse(w, "content_block_delta", js(map[string]any{"type": "content_block_delta", "index": i, "delta": map[string]any{"type": "thinking_delta", "thinking": b.Thinking}}))
			sse(w, "content_block_delta", js(map[string]any{"type": "content_block_delta", "index": i, "delta": map[string]any{"type": "signature_delta", "signature": b.Signature}}))
		case "text":
			sse(w, "content_block_start", fmt.Sprintf(`{"type":"content_block_start","index":%d,"content_block":{"type":"text","text":""}}`, i))
			sse(w, "content_block_delta", js(map[string]any{"type": "content_block_delta", "index": i, "delta": map[string]any{"type": "text_delta", "text": b.Text}}))
		case "tool_use":
			sse(w, "content_block_start", js(map[string]any{"type": "content_block_start", "index": i,
				"content_block": map[string]any{"type": "tool_use", "id": b.ID, "name": b.Name, "input": map[string]any{}}}))
			sse(w, "content_block_delta", js(map[string]any{"type": "content_block_delta", "index": i, "delta": map[string]any{"type": "input_json_delta", "partial_json": string(b.Input)}}))
		}
		sse(w, "content_block_stop", fmt.Sprintf(`{"type":"content_block_stop","index":%d}`, i))
	}
	sse(w, "message_delta", fmt.Sprintf(`{"type":"message_delta","delta":{"stop_reason":%q,"stop_sequence":null},"usage":{"output_tokens":%d}}`, a.stop(), a.out))
	sse(w, "message_stop", `{"type":"message_stop"}`)
}

// replayStep is what one request of a replay measured.
type replayStep struct {
	// at is the index of the assistant turn the request asked for.
	at int
	// direct and proxied are the request's latency sent to the upstream
	// directly (0 when not sent) and through the proxy.
	direct, proxied time.Duration
	// ctxTokens and fullTokens are ctxpipe's counts of what went upstream
	// and of every turn the client sent (the proxy's headers).
	ctxTokens, fullTokens int
	// upBytes and clientBytes are the message lists' sizes: what the
	// upstream received and what the client sent.
	upBytes, clientBytes int
	// prefix: the forwarded list starts with the previous request's
	// forwarded list, byte for byte (false for the first request).
	prefix bool
	// listLen is how many messages were forwarded; usage the input tokens
	// the upstream reported.
	listLen, usage int
}

// replayRun is a transcript replayed through the proxy.
type replayRun struct {
	name  string
	steps []replayStep
	// afterReduction marks the requests that followed a reduction (a
	// condense, truncation or masking caused by one of the turns recorded
	// since the previous request), by the conversation's stored events.
	afterReduction []bool
	reductions     int
}

// replayer drives transcripts through a proxy in front of a replayModel.
type replayer struct {
	c      *client.Client
	proxy  string // the proxy's base URL
	model  *replayModel
	direct bool // also send every request straight to the upstream, first
	// stream: every other request asks for SSE.
	stream bool
	// window, when > 0, is a client that compacts its own history when
	// the usage it is told exceeds it: the replay fails there.
	window int
	// limit, when > 0, stops after that many requests.
	limit int
}

// send posts body to base+"/v1/messages" and returns the response with its
// whole body read, and the time that took.
func replaySend(base string, hdr http.Header, body []byte) (*http.Response, []byte, time.Duration, error) {
	req, err := http.NewRequest(http.MethodPost, base+"/v1/messages", bytes.NewReader(body))
	if err != nil {
		return nil, nil, 0, err
	}
	req.Header = hdr.Clone()
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, 0, err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, b, time.Since(start), err
}

// run replays transcript t in conversation conv.
func (rp *replayer) run(ctx context.Context, t quality.Transcript, conv string) (*replayRun, error) {
	run := &replayRun{name: t.Name}
	sys := string(marshal(t.System))
	var msgs []jsontext.Value
	var prev [][]byte
	var starts []int // for each request, the index of its first new turn
	from := 0
	for i := range t.Turns {
		turn := &t.Turns[i]
		if turn.Role != schema.RoleAssistant {
			msgs = append(msgs, replayUser(turn.Content))
			continue
		}
		if rp.limit > 0 && len(run.steps) >= rp.limit {
			break
		}
		stream := rp.stream && len(run.steps)%2 == 1
		list := joinArray(msgs)
		body := fmt.Appendf(nil, `{"model":"replay","max_tokens":8192,"system":%s,"stream":%t,"messages":%s}`, sys, stream, list)
		hdr := http.Header{"Content-Type": {"application/json"}, "Anthropic-Version": {"2023-06-01"}, "X-Api-Key": {"client-key"},
			"X-Claude-Code-Session-Id": {conv}, hdrReplayConv: {t.Name}, hdrReplayTurn: {strconv.Itoa(i)}}
		if stream {
			hdr.Set(hdrReplayStream, "1")
		}
		st := replayStep{at: i, clientBytes: len(list)}
		if rp.direct {
			resp, b, d, err := replaySend(rp.model.srv.URL, hdr, body)
			if err != nil || resp.StatusCode != http.StatusOK {
				return nil, fmt.Errorf("%s turn %d direct: %v %s", t.Name, i, err, clip(string(b), 200))
			}
			st.direct = d
		}
		hdr.Set(hdrReplayKeep, "1")
		resp, b, d, err := replaySend(rp.proxy, hdr, body)
		if err != nil {
			return nil, fmt.Errorf("%s turn %d: %w", t.Name, i, err)
		}
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("%s turn %d: %d %s", t.Name, i, resp.StatusCode, clip(string(b), 300))
		}
		if got := resp.Header.Get("X-Ctxpipe-Conversation"); got != conv {
			return nil, fmt.Errorf("%s turn %d: recorded in %q, want %q (forked from %q)", t.Name, i, got, conv, resp.Header.Get("X-Ctxpipe-Forked-From"))
		}
		st.proxied = d
		st.ctxTokens, _ = strconv.Atoi(resp.Header.Get("X-Ctxpipe-Context-Tokens"))
		st.fullTokens, _ = strconv.Atoi(resp.Header.Get("X-Ctxpipe-Original-Tokens"))
		up := rp.model.take(t.Name)
		o, err := parseObject(up)
		if err != nil {
			return nil, fmt.Errorf("%s turn %d: the upstream got %w", t.Name, i, err)
		}
		fwd, err := splitArray(o.get("messages"))
		if err != nil {
			return nil, fmt.Errorf("%s turn %d: the upstream's messages: %w", t.Name, i, err)
		}
		st.upBytes, st.listLen = len(o.get("messages")), len(fwd)
		st.usage = len(up)/4 + 1
		if len(run.steps) > 0 {
			st.prefix = len(fwd) >= len(prev)
			for j := 0; st.prefix && j < len(prev); j++ {
				st.prefix = bytes.Equal(fwd[j], prev[j])
			}
		}
		prev = prev[:0]
		for _, e := range fwd {
			prev = append(prev, e)
		}
		if rp.window > 0 && st.usage > rp.window {
			return run, fmt.Errorf("%s turn %d: the upstream reported %d input tokens, over the client's window of %d: the client would compact itself here",
				t.Name, i, st.usage, rp.window)
		}
		run.steps = append(run.steps, st)
		starts = append(starts, from)
		from = i
		msgs = append(msgs, marshal(map[string]any{"role": "assistant", "content": rp.model.replies[t.Name][i]}))
	}
	if err := rp.classify(ctx, conv, run, starts); err != nil {
		return nil, err
	}
	return run, nil
}

// classify marks the requests that came right after a reduction: those
// whose new turns (or the previous request's reply) include the input a
// reduction event names.
func (rp *replayer) classify(ctx context.Context, conv string, run *replayRun, starts []int) error {
	// The last reply is recorded after it reached the client: wait until
	// the conversation holds it, so that its events are in too.
	want := 0
	if n := len(run.steps); n > 0 {
		want = run.steps[n-1].at + 1
	}
	var ids []string
	deadline := time.Now().Add(time.Minute)
	for {
		h, err := rp.c.History(ctx, conv, client.View(schema.ViewFull))
		if err != nil {
			return fmt.Errorf("history of %s: %w", conv, err)
		}
		ids = ids[:0]
		for i := range h.Messages {
			if !h.Messages[i].Synthetic() {
				ids = append(ids, h.Messages[i].ID)
			}
		}
		if len(ids) >= want || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(ids) != want {
		return fmt.Errorf("%s holds %d agent turns, want the %d the replay sent and was answered", conv, len(ids), want)
	}
	pos := make(map[string]int, len(ids))
	for i, id := range ids {
		pos[id] = i
	}
	reduced := map[int]bool{}
	for ev, err := range rp.c.StoredEvents(ctx, conv, 0) {
		if err != nil {
			return fmt.Errorf("events of %s: %w", conv, err)
		}
		if quality.ReductionEvents[ev.Header().Type] {
			p, ok := pos[ev.Header().InputID]
			if !ok {
				return fmt.Errorf("%s: a %s event names input %s, which is no turn of the replay", conv, ev.Header().Type, ev.Header().InputID)
			}
			reduced[p] = true
			run.reductions++
		}
		if r, ok := ev.(*schema.InputRejected); ok {
			return fmt.Errorf("%s: an input was rejected: %s: %s", conv, r.Reason, r.Message)
		}
	}
	run.afterReduction = make([]bool, len(run.steps))
	for j, st := range run.steps {
		for p := starts[j]; p < st.at; p++ {
			run.afterReduction[j] = run.afterReduction[j] || reduced[p]
		}
	}
	return nil
}

// replaySummary adds up replayed runs.
type replaySummary struct {
	transcripts, requests int
	// between: requests with no reduction since the previous one, and of
	// them those whose forwarded list extended the previous one.
	between, kept int
	// after: requests right after a reduction, and of them those that
	// still extended the previous list.
	after, keptAfter int
	reductions       int
	ctxTokens        int
	fullTokens       int
	upBytes          int
	clientBytes      int
	maxUsage         int
	broken           []string
}

func summarize(runs []*replayRun) replaySummary {
	var s replaySummary
	for _, r := range runs {
		s.transcripts++
		s.reductions += r.reductions
		for j, st := range r.steps {
			s.requests++
			s.ctxTokens += st.ctxTokens
			s.fullTokens += st.fullTokens
			s.upBytes += st.upBytes
			s.clientBytes += st.clientBytes
			s.maxUsage = max(s.maxUsage, st.usage)
			if j == 0 {
				continue
			}
			if r.afterReduction[j] {
				s.after++
				if st.prefix {
					s.keptAfter++
				}
				continue
			}
			s.between++
			if st.prefix {
				s.kept++
			} else if len(s.broken) < 5 {
				s.broken = append(s.broken, fmt.Sprintf("%s turn %d", r.name, st.at))
			}
		}
	}
	return s
}

// String is the summary in words, for logs.
func (s replaySummary) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d transcripts, %d requests, %d reductions; ", s.transcripts, s.requests, s.reductions)
	fmt.Fprintf(&b, "prefix kept by %d of %d requests between reductions (%.2f %%), by %d of %d right after one; ",
		s.kept, s.between, pct(s.kept, s.between), s.keptAfter, s.after)
	fmt.Fprintf(&b, "upstream got %d of %d tokens (%.1f %%), %d of %d bytes (%.1f %%)",
		s.ctxTokens, s.fullTokens, pct(s.ctxTokens, s.fullTokens), s.upBytes, s.clientBytes, pct(s.upBytes, s.clientBytes))
	if len(s.broken) > 0 {
		fmt.Fprintf(&b, "; prefix broken without a reduction at %v", s.broken)
	}
	return b.String()
}

func pct(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}
