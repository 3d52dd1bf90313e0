package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// model is an upstream that speaks the Chat Completions, Responses and
// Messages wire formats (JSON and SSE, as the providers write them) with a
// scripted agent model: to a user message it answers with two parallel
// tool calls, to tool results with text. Every request is kept.
type model struct {
	srv *httptest.Server

	mu   sync.Mutex
	reqs []seen
	// overflowOver, when > 0, answers "context window exceeded" to a
	// request whose message list is longer than this many bytes.
	overflowOver int
	// hang delays every answer.
	hang time.Duration
	// thinking adds a signed thinking block to Messages replies.
	thinking bool
	// inspect, when set, is called with each request before it is
	// answered, while the proxy waits for the answer.
	inspect func(r *http.Request, body []byte)
	// gate, when set, holds a streamed answer after its first event until
	// it is closed.
	gate chan struct{}
	// linger, when set, holds a streamed answer open after its last event
	// until the request is cancelled (at most 10 s): its reader sees the
	// reply's own last event but no end of the body. (An answer that is
	// not flushed would not be sent at all meanwhile.)
	linger bool
	n      int
}

// seen is one request as the upstream received it.
type seen struct {
	path   string
	header http.Header
	body   []byte
}

func newModel(t *testing.T) *model {
	m := &model{}
	m.srv = httptest.NewServer(http.HandlerFunc(m.serve))
	t.Cleanup(m.srv.Close)
	return m
}

func (m *model) requests() []seen {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]seen(nil), m.reqs...)
}

// list returns the message list of a request as its elements' bytes.
func (s seen) list(t *testing.T) []string {
	t.Helper()
	o, err := parseObject(s.body)
	if err != nil {
		t.Fatal(err)
	}
	name := "messages"
	if strings.HasSuffix(s.path, "/responses") {
		name = "input"
	}
	elems, err := splitArray(o.get(name))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	out := make([]string, len(elems))
	for i, e := range elems {
		out[i] = string(e)
	}
	return out
}

func (m *model) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	m.mu.Lock()
	m.reqs = append(m.reqs, seen{path: r.URL.Path, header: r.Header.Clone(), body: body})
	m.n++
	n, over, hang, thinking, inspect, gate, linger := m.n, m.overflowOver, m.hang, m.thinking, m.inspect, m.gate, m.linger
	m.mu.Unlock()
	if linger {
		defer func() {
			select {
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
		}()
	}
	if inspect != nil {
		inspect(r, body)
	}
	if gate != nil {
		w = &gatedWriter{ResponseWriter: w, gate: gate}
	}
	if hang > 0 {
		select {
		case <-time.After(hang):
		case <-r.Context().Done():
			return
		}
	}
	if r.Method == http.MethodGet && r.URL.Path == "/v1/models" {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Request-Id", "req_models")
		// A hop-by-hop header of the upstream's own, named in Connection.
		w.Header().Set("Connection", "X-Upstream-Hop")
		w.Header().Set("X-Upstream-Hop", "1")
		fmt.Fprint(w, `{"object":"list","data":[{"id":"test-model","object":"model","created":1,"owned_by":"test"}]}`)
		return
	}
	if r.URL.Path == "/api/hello" {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"message":"hello"}`)
		return
	}
	var req struct {
		Stream   bool              `json:"stream"`
		Messages []json.RawMessage `json:"messages"`
		Input    json.RawMessage   `json:"input"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, `{"error":{"message":"bad json","type":"invalid_request_error"}}`, http.StatusBadRequest)
		return
	}
	list := req.Messages
	if r.URL.Path == "/v1/responses" {
		_ = json.Unmarshal(req.Input, &list)
	}
	size := 0
	for _, e := range list {
		size += len(e)
	}
	if over > 0 && size > over {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		if r.URL.Path == "/v1/messages" {
			fmt.Fprintf(w, `{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: %d tokens > %d maximum"}}`, size/4, over/4)
		} else {
			fmt.Fprintf(w, `{"error":{"message":"This model's maximum context length is %d tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`, over/4)
		}
		return
	}
	last := ""
	if len(list) > 0 {
		last = string(list[len(list)-1])
	}
	toolTurn := strings.Contains(last, `"tool_result"`) || strings.Contains(last, `"role":"tool"`) || strings.Contains(last, `"function_call_output"`)
	a := answer{n: n, in: size/4 + 1, out: 20}
	if strings.Contains(last, "detailed summary of the conversation so far") {
		a.text = compactionSummary
	} else if toolTurn {
		a.text = fmt.Sprintf("Step %d is done: the files are listed and nothing failed.", n)
	} else {
		a.calls = []call{{fmt.Sprintf("call_%d_a", n), "bash", fmt.Sprintf(`{"command":"ls dir%d"}`, n)},
			{fmt.Sprintf("call_%d_b", n), "read_file", fmt.Sprintf(`{"path":"file%d.go"}`, n)}}
		a.text = "Let me look."
	}
	a.thinking = thinking
	switch r.URL.Path {
	case "/v1/chat/completions":
		a.chat(w, req.Stream)
	case "/v1/messages":
		a.messages(w, req.Stream)
	case "/v1/responses":
		a.responses(w, req.Stream)
	case "/v1/messages/count_tokens":
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"input_tokens":%d}`, a.in)
	default:
		http.NotFound(w, r)
	}
}

// compactionSummary is what the scripted model answers to an agent's
// compaction prompt: an analysis the agent drops, then the summary.
const compactionSummary = "<analysis>\nThe user wants the failing test fixed; I listed directories.\n</analysis>\n<summary>\n" +
	"1. Primary request: fix the failing test in pkg/x, looking at one directory per step.\n" +
	"2. Work done: every directory listed so far held only entry_NN.go files of 4096 bytes.\n" +
	"3. Next step: look at the next directory and read the test that fails.\n</summary>"

// gatedWriter holds a stream after its first flushed event until gate is
// closed: a test reads that event through the proxy meanwhile.
type gatedWriter struct {
	http.ResponseWriter
	gate    chan struct{}
	flushed bool
}

func (g *gatedWriter) Flush() {
	g.ResponseWriter.(http.Flusher).Flush()
	if !g.flushed {
		g.flushed = true
		<-g.gate
	}
}

type call struct{ id, name, args string }

type answer struct {
	n, in, out int
	text       string
	calls      []call
	thinking   bool
}

func js(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func sse(w http.ResponseWriter, event, data string) {
	if event != "" {
		fmt.Fprintf(w, "event: %s\n", event)
	}
	fmt.Fprintf(w, "data: %s\n\n", data)
	w.(http.Flusher).Flush()
}

func (a answer) chat(w http.ResponseWriter, stream bool) {
	id := fmt.Sprintf("chatcmpl-%d", a.n)
	finish := "stop"
	var calls []map[string]any
	for _, c := range a.calls {
		calls = append(calls, map[string]any{"id": c.id, "type": "function", "function": map[string]any{"name": c.name, "arguments": c.args}})
	}
	if len(calls) > 0 {
		finish = "tool_calls"
	}
	usage := map[string]any{"prompt_tokens": a.in, "completion_tokens": a.out, "total_tokens": a.in + a.out}
	if !stream {
		msg := map[string]any{"role": "assistant", "content": a.text, "refusal": nil}
		if len(calls) > 0 {
			msg["tool_calls"] = calls
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, js(map[string]any{"id": id, "object": "chat.completion", "created": 1750000000, "model": "test-model",
			"choices": []any{map[string]any{"index": 0, "message": msg, "logprobs": nil, "finish_reason": finish}}, "usage": usage}))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	chunk := func(delta map[string]any, fin any) {
		sse(w, "", js(map[string]any{"id": id, "object": "chat.completion.chunk", "created": 1750000000, "model": "test-model",
			"choices": []any{map[string]any{"index": 0, "delta": delta, "logprobs": nil, "finish_reason": fin}}}))
	}
	chunk(map[string]any{"role": "assistant", "content": ""}, nil)
	for _, part := range strings.SplitAfter(a.text, " ") {
		chunk(map[string]any{"content": part}, nil)
	}
	for i, c := range a.calls {
		chunk(map[string]any{"tool_calls": []any{map[string]any{"index": i, "id": c.id, "type": "function", "function": map[string]any{"name": c.name, "arguments": ""}}}}, nil)
		half := len(c.args) / 2
		for _, frag := range []string{c.args[:half], c.args[half:]} {
			chunk(map[string]any{"tool_calls": []any{map[string]any{"index": i, "function": map[string]any{"arguments": frag}}}}, nil)
		}
	}
	chunk(map[string]any{}, finish)
	sse(w, "", js(map[string]any{"id": id, "object": "chat.completion.chunk", "created": 1750000000, "model": "test-model", "choices": []any{}, "usage": usage}))
	sse(w, "", "[DONE]")
}

func (a answer) messages(w http.ResponseWriter, stream bool) {
	var blocks []map[string]any
	sig := fmt.Sprintf("EqQBCkYIARgCKkD+sig/%d==", a.n)
	if a.thinking {
		blocks = append(blocks, map[string]any{"type": "thinking", "thinking": fmt.Sprintf("I should act on step %d.", a.n), "signature": sig})
	}
	blocks = append(blocks, map[string]any{"type": "text", "text": a.text})
	for _, c := range a.calls {
		blocks = append(blocks, map[string]any{"type": "tool_use", "id": "toolu_" + c.id, "name": c.name, "input": json.RawMessage(c.args)})
	}
	stop := "end_turn"
	if len(a.calls) > 0 {
		stop = "tool_use"
	}
	usage := map[string]any{"input_tokens": a.in, "output_tokens": a.out, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
	id := fmt.Sprintf("msg_%d", a.n)
	if !stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, js(map[string]any{"id": id, "type": "message", "role": "assistant", "model": "test-model",
			"content": blocks, "stop_reason": stop, "stop_sequence": nil, "usage": usage}))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	sse(w, "message_start", js(map[string]any{"type": "message_start", "message": map[string]any{"id": id, "type": "message", "role": "assistant",
		"model": "test-model", "content": []any{}, "stop_reason": nil, "stop_sequence": nil,
		"usage": map[string]any{"input_tokens": a.in, "output_tokens": 1, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}}))
	sse(w, "ping", `{"type": "ping"}`)
	for i, b := range blocks {
		switch b["type"] {
		case "thinking":
			sse(w, "content_block_start", js(map[string]any{"type": "content_block_start", "index": i, "content_block": map[string]any{"type": "thinking", "thinking": "", "signature": ""}}))
			sse(w, "content_block_delta", js(map[string]any{"type": "content_block_delta", "index": i, "delta": map[string]any{"type": "thinking_delta", "thinking": b["thinking"]}}))
			sse(w, "content_block_delta", js(map[string]any{"type": "content_block_delta", "index": i, "delta": map[string]any{"type": "signature_delta", "signature": sig}}))
		case "text":
			sse(w, "content_block_start", js(map[string]any{"type": "content_block_start", "index": i, "content_block": map[string]any{"type": "text", "text": ""}}))
			for _, part := range strings.SplitAfter(a.text, " ") {
				sse(w, "content_block_delta", js(map[string]any{"type": "content_block_delta", "index": i, "delta": map[string]any{"type": "text_delta", "text": part}}))
			}
		case "tool_use":
			sse(w, "content_block_start", js(map[string]any{"type": "content_block_start", "index": i, "content_block": map[string]any{"type": "tool_use", "id": b["id"], "name": b["name"], "input": map[string]any{}}}))
			args := string(b["input"].(json.RawMessage))
			half := len(args) / 2
			for _, frag := range []string{args[:half], args[half:]} {
				sse(w, "content_block_delta", js(map[string]any{"type": "content_block_delta", "index": i, "delta": map[string]any{"type": "input_json_delta", "partial_json": frag}}))
			}
		}
		sse(w, "content_block_stop", js(map[string]any{"type": "content_block_stop", "index": i}))
	}
	sse(w, "message_delta", js(map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": stop, "stop_sequence": nil}, "usage": map[string]any{"output_tokens": a.out}}))
	sse(w, "message_stop", `{"type":"message_stop"}`)
}

func (a answer) responses(w http.ResponseWriter, stream bool) {
	var output []map[string]any
	output = append(output, map[string]any{"type": "message", "id": fmt.Sprintf("msg_%d", a.n), "role": "assistant", "status": "completed",
		"content": []any{map[string]any{"type": "output_text", "text": a.text, "annotations": []any{}}}})
	for _, c := range a.calls {
		output = append(output, map[string]any{"type": "function_call", "id": "fc_" + c.id, "call_id": c.id, "name": c.name, "arguments": c.args, "status": "completed"})
	}
	resp := map[string]any{"id": fmt.Sprintf("resp_%d", a.n), "object": "response", "created_at": 1750000000, "status": "completed",
		"model": "test-model", "output": output, "parallel_tool_calls": true, "tool_choice": "auto", "tools": []any{},
		"usage": map[string]any{"input_tokens": a.in, "output_tokens": a.out, "total_tokens": a.in + a.out,
			"input_tokens_details": map[string]any{"cached_tokens": 0}, "output_tokens_details": map[string]any{"reasoning_tokens": 0}}}
	if !stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, js(resp))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	seq := 0
	ev := func(typ string, fields map[string]any) {
		fields["type"], fields["sequence_number"] = typ, seq
		seq++
		sse(w, typ, js(fields))
	}
	started := map[string]any{}
	for k, v := range resp {
		started[k] = v
	}
	started["status"], started["output"], started["usage"] = "in_progress", []any{}, nil
	ev("response.created", map[string]any{"response": started})
	for i, item := range output {
		ev("response.output_item.added", map[string]any{"output_index": i, "item": item})
		ev("response.output_item.done", map[string]any{"output_index": i, "item": item})
	}
	ev("response.completed", map[string]any{"response": resp})
}
