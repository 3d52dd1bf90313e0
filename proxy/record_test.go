package proxy

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/client"
	"github.com/ctxpipe/ctxpipe/schema"
)

// toolExchange is a request whose new turns are a user's request, a tool
// call, and its result, the result too large for the server to take.
func toolExchange() []byte {
	huge := strings.Repeat("x", bus.MaxMsgSize+1024)
	return []byte(`{"model":"m","max_tokens":100,"messages":[{"role":"user","content":"List the files."},` +
		`{"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"bash","input":{"command":"ls"}}]},` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"` + huge + `"}]}]}`)
}

// recordedAfter appends a turn of its own to conv and returns the agent
// turns conv holds once it is applied, that one left out: what earlier
// publishes left there, whenever they would have been applied.
func (h *harness) recordedAfter(t *testing.T, conv string) []schema.Message {
	t.Helper()
	ctx := context.Background()
	id, err := h.c.Append(ctx, schema.Turn{ConversationID: conv, Role: schema.RoleUser, Content: schema.TextContent("sentinel")})
	if err != nil {
		t.Fatal(err)
	}
	r, err := h.c.History(ctx, conv, client.View(schema.ViewFull), client.WaitFor(id))
	if err != nil {
		t.Fatal(err)
	}
	return r.Messages[:len(r.Messages)-1]
}

// A request's new turns are recorded as one atomic batch: when one of them
// cannot be, none is (no tool call without its result), and the request
// goes on unmanaged.
func TestNewTurnsAllOrNothing(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxBodyBytes = 2 * bus.MaxMsgSize })
	before := len(h.model.requests())
	resp, b := h.post(t, "/v1/messages", toolExchange(), map[string]string{"X-Claude-Code-Session-Id": "aon-1"})
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Ctxpipe-Managed") != "false" {
		t.Fatalf("%d %s (managed %q), want the request forwarded unmanaged", resp.StatusCode, clip(string(b), 200), resp.Header.Get("X-Ctxpipe-Managed"))
	}
	if len(h.model.requests()) != before+1 {
		t.Fatal("the request did not reach the upstream")
	}
	if got := h.recordedAfter(t, "aon-1"); len(got) != 0 {
		t.Fatalf("%d of the request's turns were recorded, want none", len(got))
	}
}

// Where the stream takes no atomic batches, the turns are published one by
// one; when that stops half way, the upstream is not called (the last
// turn recorded may be a tool call without its result) and the client is
// told to send the request again, in its API's error format.
func TestNewTurnsInPartWithoutAtomicBatches(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxBodyBytes = 2 * bus.MaxMsgSize })
	ctx := context.Background()
	nc, err := nats.Connect(h.svc.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := h.svc.WaitConsuming(wctx); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, bus.StreamIn)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.AllowAtomicPublish = false
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	before := len(h.model.requests())
	resp, b := h.post(t, "/v1/messages", toolExchange(), map[string]string{"X-Claude-Code-Session-Id": "aon-2"})
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), `"type":"error"`) {
		t.Fatalf("%d %s, want 503 in the Messages API's format", resp.StatusCode, clip(string(b), 200))
	}
	if len(h.model.requests()) != before {
		t.Fatal("the request reached the upstream with its turns recorded in part")
	}
	got := h.recordedAfter(t, "aon-2")
	if len(got) != 2 || got[1].Role != schema.RoleAssistant {
		t.Fatalf("%d turns recorded, want the request's first two (the tool call without its result)", len(got))
	}
	// Small turns go through one by one, as before.
	resp, b = h.post(t, "/v1/messages", []byte(`{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"},`+
		`{"role":"assistant","content":"hello"},{"role":"user","content":"bye"}]}`), map[string]string{"X-Claude-Code-Session-Id": "aon-3"})
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Ctxpipe-Managed") == "false" {
		t.Fatalf("%d %s", resp.StatusCode, clip(string(b), 200))
	}
	if _, err := h.c.Status(ctx, "aon-3"); errors.Is(err, client.ErrNotFound) {
		t.Fatal("nothing recorded one by one")
	}
}
