package proxy

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/client"
	"github.com/ctxpipe/ctxpipe/client/clienttest"
	"github.com/ctxpipe/ctxpipe/schema"
)

// harness is the real service on an embedded server, the proxy in front of
// the scripted upstream, and a ctxpipe client to look at what was recorded.
type harness struct {
	svc   *clienttest.Service
	c     *client.Client
	model *model
	proxy *Proxy
	srv   *httptest.Server
}

// smallWindow is a profile whose threshold a loop of a few dozen turns
// crosses more than once.
func smallWindow() schema.Profile {
	return schema.Profile{ID: schema.DefaultProfileID, ContextWindow: 6000, MaxTokens: 400, CondenseThreshold: ptr(60)}
}

func newHarness(t *testing.T, tune func(*Config)) *harness {
	t.Helper()
	h := &harness{svc: clienttest.New(t, clienttest.WithProfiles(smallWindow())), model: newModel(t)}
	c, err := client.Connect(bus.ConnConfig{URL: h.svc.URL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	h.c = c
	waitApplying(t, c)
	cfg := Config{
		OpenAI:    Upstream{BaseURL: h.model.srv.URL + "/v1", APIKey: "sk-upstream"},
		Anthropic: Upstream{BaseURL: h.model.srv.URL, APIKey: "ak-upstream"},
		Secret:    []byte("test secret"),
	}
	if testing.Verbose() {
		cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if tune != nil {
		tune(&cfg)
	}
	h.proxy = New(c, cfg)
	h.srv = httptest.NewServer(h.proxy)
	t.Cleanup(h.srv.Close)
	return h
}

// waitApplying returns once the service applies inputs: it consumes them
// only after taking its partitions, which on a loaded machine can outlast
// the client's timeout, and a test's first request would then go on
// unmanaged. Readiness is not a timed assertion: the minute only bounds a
// broken start.
func waitApplying(tb testing.TB, c *client.Client) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id, err := c.Append(ctx, schema.Turn{ConversationID: "harness-ready", Role: schema.RoleUser, Content: schema.TextContent("ready?")})
	if err == nil {
		err = c.Wait(ctx, "harness-ready", id)
	}
	if err != nil {
		tb.Fatalf("the service does not apply inputs: %v", err)
	}
}

// full is conv's full history.
func (h *harness) full(t *testing.T, conv string) []schema.Message {
	t.Helper()
	r, err := h.c.History(context.Background(), conv, client.View(schema.ViewFull))
	if err != nil {
		t.Fatalf("history of %s: %v", conv, err)
	}
	return r.Messages
}

// rejected returns the input_rejected events of conv.
func (h *harness) rejected(t *testing.T, conv string) []string {
	t.Helper()
	return storedOf(t, h, conv, func(r *schema.InputRejected) string { return string(r.Reason) + ": " + r.Message })
}

// storedOf reads each of conv's stored events of type E with of, in order.
func storedOf[E schema.Event](t *testing.T, h *harness, conv string, of func(E) string) []string {
	t.Helper()
	var out []string
	for ev, err := range h.c.StoredEvents(context.Background(), conv, 0) {
		if err != nil {
			t.Fatal(err)
		}
		if e, ok := ev.(E); ok {
			out = append(out, of(e))
		}
	}
	return out
}

func ptr[T any](v T) *T { return &v }

// waitFull is conv's full history once it holds n messages: a reply is
// recorded after it reached the client, so a test may look before it is
// applied. The deadline only bounds a broken run.
func (h *harness) waitFull(t *testing.T, conv string, n int) []schema.Message {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		m := h.full(t, conv)
		if len(m) >= n || time.Now().After(deadline) {
			return m
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// agentTurns is how many agent turns conv holds, once it holds n (or the
// bound ran out).
func (h *harness) agentTurns(t *testing.T, conv string, n int) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		agent := 0
		for _, m := range h.full(t, conv) {
			if !m.Synthetic() {
				agent++
			}
		}
		if agent >= n || time.Now().After(deadline) {
			return agent
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// send does req with the default client and returns the response with its
// body read and closed.
func send(t *testing.T, req *http.Request) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}
