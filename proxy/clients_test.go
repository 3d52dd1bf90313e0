package proxy

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
)

// What agent CLIs do besides their model calls reaches the right upstream
// unchanged: Claude Code's probe of /api/hello (no Anthropic header on
// it), Codex's model list with its query and headers; hop-by-hop headers
// stay on their hop, both ways.
func TestUnmanagedRequestsPassThrough(t *testing.T) {
	h := newHarness(t, nil)
	for _, method := range []string{http.MethodHead, http.MethodGet} {
		req, _ := http.NewRequest(method, h.srv.URL+"/api/hello", nil)
		req.Header.Set("User-Agent", "claude-cli/2.0.0 (external, cli)")
		resp, b := send(t, req)
		reqs := h.model.requests()
		if got := reqs[len(reqs)-1]; resp.StatusCode != 200 || got.path != "/api/hello" || got.header.Get("X-Api-Key") != "ak-upstream" {
			t.Fatalf("%s /api/hello: %d %s, the upstream got %s with the Anthropic key %q", method, resp.StatusCode, b, got.path, got.header.Get("X-Api-Key"))
		}
		if method == http.MethodGet && string(b) != `{"message":"hello"}` {
			t.Errorf("GET /api/hello answered %s", b)
		}
	}

	req, _ := http.NewRequest(http.MethodGet, h.srv.URL+"/v1/models?client_version=0.50.0", nil)
	req.Header.Set("Authorization", "Bearer client-key")
	req.Header.Set("Originator", "codex_cli_rs")
	req.Header.Set("OpenAI-Beta", "responses=experimental")
	req.Header.Set("Connection", "X-Client-Hop")
	req.Header.Set("X-Client-Hop", "1")
	req.Header.Set("Proxy-Authorization", "Basic c2VjcmV0")
	req.Header.Set("Keep-Alive", "timeout=5")
	resp, b := send(t, req)
	if resp.StatusCode != 200 || !strings.Contains(string(b), "test-model") {
		t.Fatalf("GET /v1/models: %d %s", resp.StatusCode, b)
	}
	reqs := h.model.requests()
	got := reqs[len(reqs)-1]
	if got.path != "/v1/models" || got.header.Get("Originator") != "codex_cli_rs" || got.header.Get("Openai-Beta") != "responses=experimental" {
		t.Errorf("the upstream got %s with %v", got.path, got.header)
	}
	for _, hop := range []string{"X-Client-Hop", "Proxy-Authorization", "Keep-Alive"} {
		if got.header.Get(hop) != "" {
			t.Errorf("the hop-by-hop %s reached the upstream", hop)
		}
	}
	if resp.Header.Get("X-Request-Id") != "req_models" || resp.Header.Get("X-Upstream-Hop") != "" {
		t.Errorf("the client got the upstream's headers %v", resp.Header)
	}
	// (The upstream does send its hop-by-hop header: asked directly, it is
	// there.)
	direct, err := http.Get(h.model.srv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	direct.Body.Close()
	if direct.Header.Get("X-Upstream-Hop") != "1" {
		t.Fatalf("the upstream sent no hop-by-hop header to test with: %v", direct.Header)
	}

	// A base URL with a trailing slash doubles a slash: the same path.
	resp, b = h.post(t, "/v1//chat/completions", []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`),
		map[string]string{"X-Ctxpipe-Conversation": "slash-1"})
	if resp.StatusCode != 200 || resp.Header.Get("X-Ctxpipe-Conversation") != "slash-1" {
		t.Fatalf("POST /v1//chat/completions: %d %s", resp.StatusCode, b)
	}

	// A managed request keeps its query and beta headers (Claude Code
	// sends POST /v1/messages?beta=true).
	resp, b = h.post(t, "/v1/messages?beta=true", []byte(`{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`),
		map[string]string{"X-Claude-Code-Session-Id": "beta-1", "Anthropic-Beta": "interleaved-thinking-2025-05-14", "Anthropic-Version": "2023-06-01"})
	reqs = h.model.requests()
	got = reqs[len(reqs)-1]
	if resp.StatusCode != 200 || got.header.Get("Anthropic-Beta") != "interleaved-thinking-2025-05-14" || resp.Header.Get("X-Ctxpipe-Conversation") != "beta-1" {
		t.Fatalf("%d %s; the upstream got %v", resp.StatusCode, b, got.header)
	}
}

// Codex compresses large request bodies (zstd, sometimes gzip): the proxy
// reads them as their JSON, records their turns and sends the upstream the
// JSON it built, without the coding.
func TestCompressedRequestBodies(t *testing.T) {
	h := newHarness(t, nil)
	body := []byte(`{"model":"m","stream":false,"input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"Fix the test."}]}]}`)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(body)
	zw.Close()
	enc, _ := zstd.NewWriter(nil)
	zs := enc.EncodeAll(body, nil)
	for _, tc := range []struct {
		coding string
		data   []byte
	}{{"zstd", zs}, {"gzip", gz.Bytes()}} {
		conv := "enc-" + tc.coding
		resp, b := h.post(t, "/v1/responses", tc.data, map[string]string{"Content-Encoding": tc.coding, "Session_id": conv})
		if resp.StatusCode != 200 || resp.Header.Get("X-Ctxpipe-Conversation") != conv || resp.Header.Get("X-Ctxpipe-Managed") == "false" {
			t.Fatalf("%s: %d %s (conversation %q)", tc.coding, resp.StatusCode, b, resp.Header.Get("X-Ctxpipe-Conversation"))
		}
		reqs := h.model.requests()
		got := reqs[len(reqs)-1]
		if got.header.Get("Content-Encoding") != "" || !bytes.Equal(got.body, body) {
			t.Errorf("%s: the upstream got %q with Content-Encoding %q", tc.coding, got.body, got.header.Get("Content-Encoding"))
		}
		if n := h.agentTurns(t, conv, 2); n != 2 {
			t.Errorf("%s: %d turns recorded, want the request's and the reply", tc.coding, n)
		}
	}
	// A body that does not decode is the client's error; a coding the
	// proxy does not know goes on as it came, unmanaged.
	resp, b := h.post(t, "/v1/responses", []byte("not zstd"), map[string]string{"Content-Encoding": "zstd"})
	if resp.StatusCode != 400 || !strings.Contains(string(b), `"invalid_request_error"`) {
		t.Errorf("a corrupt zstd body: %d %s", resp.StatusCode, b)
	}
	before := len(h.model.requests())
	resp, _ = h.post(t, "/v1/responses", []byte("\x0b\x02\x80opaque"), map[string]string{"Content-Encoding": "br"})
	reqs := h.model.requests()
	if resp.Header.Get("X-Ctxpipe-Managed") != "false" || len(reqs) != before+1 || reqs[len(reqs)-1].header.Get("Content-Encoding") != "br" {
		t.Errorf("a br body: managed %q, upstream requests %d", resp.Header.Get("X-Ctxpipe-Managed"), len(reqs)-before)
	}
}

// A streamed reply reaches the client event by event: the first event is
// read through the proxy while the upstream holds back the rest.
func TestStreamedEventsAreNotHeldBack(t *testing.T) {
	h := newHarness(t, nil)
	var gate chan struct{}
	released := true
	release := func() {
		if !released {
			released = true
			close(gate)
		}
	}
	t.Cleanup(release)
	for _, tc := range []struct{ path, body, first string }{
		{"/v1/responses", `{"model":"m","stream":true,"input":[{"type":"message","role":"user","content":"Fix the test."}]}`, "event: response.created"},
		{"/v1/messages", `{"model":"m","max_tokens":10,"stream":true,"messages":[{"role":"user","content":"Fix the test."}]}`, "event: message_start"},
	} {
		released = false
		gate = make(chan struct{})
		h.model.mu.Lock()
		h.model.gate = gate
		h.model.mu.Unlock()
		req, _ := http.NewRequest(http.MethodPost, h.srv.URL+tc.path, strings.NewReader(tc.body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Ctxpipe-Conversation", "sse-"+strings.TrimPrefix(tc.path, "/v1/"))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		first := make(chan string, 1)
		go func() {
			r := bufio.NewReader(resp.Body)
			var ev strings.Builder
			for {
				line, err := r.ReadString('\n')
				ev.WriteString(line)
				if err != nil || line == "\n" {
					first <- ev.String()
					return
				}
			}
		}()
		select {
		case ev := <-first:
			if !strings.HasPrefix(ev, tc.first) {
				t.Errorf("%s: the first event read was %q", tc.path, ev)
			}
		case <-time.After(30 * time.Second): // bounds a broken run only
			t.Errorf("%s: the first event did not reach the client while the upstream held the rest", tc.path)
		}
		release()
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}
