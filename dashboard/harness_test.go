package dashboard_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/client"
	"github.com/ctxpipe/ctxpipe/client/clienttest"
	"github.com/ctxpipe/ctxpipe/dashboard"
	"github.com/ctxpipe/ctxpipe/pipeline"
	"github.com/ctxpipe/ctxpipe/schema"
)

// demo16k is cmd/consumer's built-in demo profile: a 16,000-token window,
// condensing at 60 %, which the sample session crosses several times.
func demo16k() schema.Profile {
	th := 60
	return schema.Profile{ID: "demo-16k", ContextWindow: 16000, MaxTokens: 1024, Strategy: schema.StrategyKeepTail, CondenseThreshold: &th}
}

// env is the real service in process (clienttest: embedded JetStream,
// SQLite, the engine with the offline condenser, the runner, the relay,
// the queries) with the dashboard over its own connection, as cmd/consumer
// mounts it, behind an httptest server.
type env struct {
	t    *testing.T
	d    *dashboard.Dashboard
	px   *proxy // between the dashboard and NATS
	svc  *clienttest.Service
	nc   *nats.Conn
	js   jetstream.JetStream
	cl   *client.Client // an agent's client, for turns and for reading what the service says
	srv  *httptest.Server
	http *http.Client
}

func start(t *testing.T) *env {
	t.Helper()
	profiles := []schema.Profile{clienttest.SmallProfile(schema.DefaultProfileID), demo16k()}
	svc := clienttest.New(t, clienttest.WithProfiles(profiles...))
	// The dashboard's connection stands for the service's: it must survive
	// the server going away and coming back.
	// Through a proxy, so a test can cut the dashboard off NATS while the
	// service goes on (and its clean stop stays checked).
	px := newProxy(t, svc.URL)
	nc, err := nats.Connect(px.url, nats.Name("dashboard-test"), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	d, err := dashboard.New(dashboard.Deps{
		Store: svc.Store, JS: js, Profiles: pipeline.StaticProfiles(profiles...),
		Globals: schema.Globals{AutoCondense: true, AutoCondensePercent: clienttest.Threshold},
		Poll:    100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(d)
	// End the open event streams first, or srv.Close waits for them.
	t.Cleanup(func() { d.Close(); srv.Close() })
	cl, err := client.Connect(bus.ConnConfig{URL: svc.URL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &env{t: t, d: d, px: px, svc: svc, nc: nc, js: js, cl: cl, srv: srv, http: srv.Client()}
}

// sampleTurns reads examples/sample-session.jsonl as conversation conv's
// turns under profile demo-16k, with fresh ids.
func sampleTurns(t testing.TB, conv string) []schema.Turn {
	t.Helper()
	data, err := os.ReadFile("../examples/sample-session.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	var out []schema.Turn
	for line := range strings.SplitSeq(strings.TrimSpace(string(data)), "\n") {
		var tu schema.Turn
		if err := json.Unmarshal([]byte(line), &tu); err != nil {
			t.Fatal(err)
		}
		tu.ID, tu.ConversationID, tu.ProfileID = uuid.NewString(), conv, "demo-16k"
		out = append(out, tu)
	}
	return out
}

// publish appends turns and waits until the last is applied.
func (e *env) publish(turns []schema.Turn) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var last string
	for _, tu := range turns {
		id, err := e.cl.Append(ctx, tu)
		if err != nil {
			e.t.Fatal(err)
		}
		last = id
	}
	if err := e.cl.Wait(ctx, turns[0].ConversationID, last); err != nil {
		e.t.Fatal(err)
	}
}

// get reads a JSON API answer into v and returns the status code.
func (e *env) get(path string, v any) int {
	e.t.Helper()
	resp, err := e.http.Get(e.srv.URL + path)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	if v != nil {
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			e.t.Fatalf("GET %s: %d: %v", path, resp.StatusCode, err)
		}
	}
	return resp.StatusCode
}

// post sends a control request as the page does and returns the status
// code and the body.
func (e *env) post(path, body string, header map[string]string) (int, map[string]string) {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	if host := header["Host"]; host != "" {
		req.Host = host // the header map cannot set it
	}
	resp, err := e.http.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]string
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// sse is one open event stream, read line by line.
type sse struct {
	resp   *http.Response
	events chan sseEvent
}

type sseEvent struct {
	ID, Event, Data string
}

// openSSE opens /api/events with the query q and, when lastID is not "",
// the Last-Event-ID a reconnecting browser sends.
func (e *env) openSSE(q, lastID string) *sse {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodGet, e.srv.URL+"/api/events?"+q, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "text/event-stream" {
		e.t.Fatalf("events: %d %s", resp.StatusCode, ct)
	}
	s := &sse{resp: resp, events: make(chan sseEvent, 1024)}
	go func() {
		defer close(s.events)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<22)
		var cur sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if cur.Event != "" {
					s.events <- cur
				}
				cur = sseEvent{}
			case strings.HasPrefix(line, "id: "):
				cur.ID = line[4:]
			case strings.HasPrefix(line, "event: "):
				cur.Event = line[7:]
			case strings.HasPrefix(line, "data: "):
				cur.Data = line[6:]
			}
		}
	}()
	e.t.Cleanup(s.close)
	return s
}

func (s *sse) close() { s.resp.Body.Close() }

// next returns the next event of one of the kinds, failing after d.
func (s *sse) next(t *testing.T, d time.Duration, kinds ...string) sseEvent {
	t.Helper()
	timeout := time.After(d)
	for {
		select {
		case ev, ok := <-s.events:
			if !ok {
				t.Fatalf("event stream ended while waiting for %v", kinds)
			}
			for _, k := range kinds {
				if ev.Event == k {
					return ev
				}
			}
		case <-timeout:
			t.Fatalf("no %v event within %v", kinds, d)
		}
	}
}

// ctxEvent decodes a "ctx" event's data.
func ctxEvent(t *testing.T, ev sseEvent) schema.Event {
	t.Helper()
	e, err := schema.DecodeEvent([]byte(ev.Data))
	if err != nil {
		t.Fatalf("event %s: %v", ev.ID, err)
	}
	return e
}

// proxy forwards TCP connections to a NATS server; down cuts every one and
// refuses new ones (to its clients NATS is gone), up lets them back.
type proxy struct {
	url    string
	target string
	ln     net.Listener
	mu     sync.Mutex
	conns  []net.Conn
	isDown bool
}

func newProxy(t *testing.T, natsURL string) *proxy {
	t.Helper()
	u, err := url.Parse(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{url: "nats://" + ln.Addr().String(), target: u.Host, ln: ln}
	t.Cleanup(func() { ln.Close(); p.down() })
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(in)
		}
	}()
	return p
}

func (p *proxy) serve(in net.Conn) {
	p.mu.Lock()
	if p.isDown {
		p.mu.Unlock()
		in.Close()
		return
	}
	out, err := net.Dial("tcp", p.target)
	if err != nil {
		p.mu.Unlock()
		in.Close()
		return
	}
	p.conns = append(p.conns, in, out)
	p.mu.Unlock()
	go func() { _, _ = io.Copy(out, in); out.Close() }()
	_, _ = io.Copy(in, out)
	in.Close()
}

func (p *proxy) down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.isDown = true
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *proxy) up() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.isDown = false
}
