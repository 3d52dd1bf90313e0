package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/condense"
	"github.com/ctxpipe/ctxpipe/schema"
)

// llmEnv are the variables that would point the service at a real LLM. The
// tests clear them so the offline condenser runs, whatever the machine has.
var llmEnv = []string{condense.EnvBaseURL, condense.EnvOpenAIBaseURL, condense.EnvModel, condense.EnvAPIKeyEnv,
	condense.EnvTimeout, condense.EnvMaxAttempts, condense.EnvRetryBudget}

// testLogger sends the service's warnings and errors to the test log, so a
// failure shows what the service said.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// freeAddr returns a local TCP address that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// testMain closes the service once, whether the test or its cleanup gets
// there first, and keeps the first error.
type testMain struct {
	*Main
	once sync.Once
	err  error
}

func (m *testMain) Close() error {
	m.once.Do(func() { m.err = m.Main.Close() })
	return m.err
}

// mustRunMain runs the service in-process on dataDir with the embedded NATS
// server on a random port and /metrics on a free one. It is closed on
// cleanup if the test has not closed it.
func mustRunMain(t *testing.T, dataDir string) *testMain {
	t.Helper()
	for _, k := range llmEnv {
		t.Setenv(k, "")
	}
	m := &testMain{Main: NewMain()}
	m.Config.DataDir = dataDir
	m.Config.Listen = "127.0.0.1:-1" // nats-server's RANDOM_PORT
	m.Config.HTTP = freeAddr(t)
	m.Log = testLogger(t)
	if err := m.Run(context.Background()); err != nil {
		_ = m.Close()
		t.Fatalf("run: %v", err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// client is a NATS client of the service, as an agent would use it.
type client struct {
	t  *testing.T
	nc *nats.Conn
	js jetstream.JetStream
}

// connectAs connects as one of nats.conf's demo users, with its own inbox
// prefix (the only one it may subscribe to).
func connectAs(t *testing.T, url, user string, opts ...nats.Option) *client {
	t.Helper()
	return connect(t, url, append([]nats.Option{nats.UserInfo(user, user+"-demo-password"), nats.CustomInboxPrefix("_INBOX_" + user)}, opts...)...)
}

func connect(t *testing.T, url string, opts ...nats.Option) *client {
	t.Helper()
	nc, err := nats.Connect(url, append([]nats.Option{nats.Name("consumer-test")}, opts...)...)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &client{t: t, nc: nc, js: js}
}

// publishTurn publishes one turn with its id as Nats-Msg-Id.
func (c *client) publishTurn(tn schema.Turn) {
	c.t.Helper()
	data, err := schema.Marshal(tn)
	if err != nil {
		c.t.Fatal(err)
	}
	if _, err := bus.PublishInput(context.Background(), c.js, schema.InputSubject(tn.ConversationID, schema.KindTurn), tn.ID, data); err != nil {
		c.t.Fatal(err)
	}
}

// query sends a request and decodes the reply; a query error comes back as
// a *schema.QueryErrorBody.
func (c *client) query(subject string, req, rep any, timeout time.Duration) error {
	data, err := json.Marshal(req)
	if err != nil {
		return err
	}
	msg, err := c.nc.Request(subject, data, timeout)
	if err != nil {
		return fmt.Errorf("request %s: %w", subject, err)
	}
	return schema.DecodeQueryReply(msg.Data, rep)
}

// history asks ctx.q.history, waiting up to wait for input waitFor.
func (c *client) history(conv string, view schema.View, waitFor string, wait time.Duration) ([]schema.Message, error) {
	var rep schema.HistoryReply
	req := schema.HistoryRequest{ConversationID: conv, View: view, WaitFor: waitFor, TimeoutMS: wait.Milliseconds()}
	if err := c.query(schema.SubjectHistory, req, &rep, wait+5*time.Second); err != nil {
		return nil, err
	}
	return rep.Messages, nil
}

func (c *client) mustHistory(conv string, view schema.View, waitFor string) []schema.Message {
	c.t.Helper()
	msgs, err := c.history(conv, view, waitFor, 30*time.Second)
	if err != nil {
		c.t.Fatalf("history %s: %v", conv, err)
	}
	return msgs
}

func (c *client) status(conv string) (schema.StatusReply, error) {
	var rep schema.StatusReply
	err := c.query(schema.SubjectStatus, schema.StatusRequest{ConversationID: conv}, &rep, 5*time.Second)
	return rep, err
}

// streamEvent is one message of CTX_EVENTS.
type streamEvent struct {
	msgID string // the Nats-Msg-Id header
	ev    schema.Event
}

// readEvents reads every message of CTX_EVENTS under filter with an ordered
// consumer.
func readEvents(t *testing.T, js jetstream.JetStream, filter string) []streamEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, bus.StreamEvents, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]streamEvent, 0, info.NumPending)
	for left := info.NumPending; left > 0; left-- {
		m, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			t.Fatalf("read %s: %d left: %v", bus.StreamEvents, left, err)
		}
		ev, err := schema.DecodeEvent(m.Data())
		if err != nil {
			t.Fatalf("event on %s: %v", m.Subject(), err)
		}
		if want := schema.EventSubject(ev); m.Subject() != want {
			t.Fatalf("event %s on subject %s, want %s", ev.Header().ID, m.Subject(), want)
		}
		out = append(out, streamEvent{msgID: m.Headers().Get(jetstream.MsgIDHeader), ev: ev})
	}
	return out
}

// words is the vocabulary of the generated turns: varied enough that the
// offline condenser has sentences to pick from.
var words = strings.Fields(`the handler returns an error when the request body is empty so we
check the length first then decode the payload into a struct and validate every field before
writing the row to the database inside one transaction the test covers the happy path and two
failure modes a timeout from the upstream service and a constraint violation on insert`)

// sentenceText returns about n words of prose; the same rng gives the same text.
func sentenceText(rng *rand.Rand, n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[rng.IntN(len(words))])
		if i%12 == 11 {
			b.WriteByte('.')
		}
	}
	b.WriteByte('.')
	return b.String()
}

// textTurn is a plain-text turn of about n words; even i is the user's.
func textTurn(rng *rand.Rand, conv, profile string, i int, ts int64, n int) schema.Turn {
	role := schema.RoleUser
	if i%2 == 1 {
		role = schema.RoleAssistant
	}
	return schema.Turn{ID: uuid.NewString(), ConversationID: conv, AgentID: "tester", ProfileID: profile,
		TS: ts, Role: role, Content: schema.TextContent(fmt.Sprintf("Turn %d. %s", i, sentenceText(rng, n)))}
}

func TestRunCondensesServesQueriesAndSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	m := mustRunMain(t, dir)
	if m.ns == nil {
		t.Fatal("no embedded server")
	}
	// An agent of tenant acme; the service's own user reads CTX_EVENTS,
	// where acme's conversation is acme.<conv>.
	c := connectAs(t, m.ns.ClientURL(), "acme-agent")
	svc := connectAs(t, m.ns.ClientURL(), "ctxpipe")

	// demo-16k: window 16000, threshold 60 % = 9600 tokens. 20 turns of
	// about 600 tokens each cross it once, around the 16th turn.
	const conv, profile = "demo-conv", "demo-16k"
	rng := rand.New(rand.NewPCG(1, 2))
	var turns []schema.Turn
	for i := 0; i < 20; i++ {
		tn := textTurn(rng, conv, profile, i, 1_700_000_000_000+int64(i)*1000, 330)
		turns = append(turns, tn)
		c.publishTurn(tn)
	}
	last := turns[len(turns)-1]
	eff := c.mustHistory(conv, schema.ViewEffective, last.ID)
	if n := len(eff); n == 0 || eff[n-1].ID != last.ID {
		t.Fatalf("effective history does not end with the last turn: %d messages", n)
	}
	full := c.mustHistory(conv, schema.ViewFull, "")
	var stored []string
	var summaries []schema.Message
	for _, msg := range full {
		if msg.Synthetic() {
			if msg.IsSummary {
				summaries = append(summaries, msg)
			}
			continue
		}
		stored = append(stored, msg.ID)
	}
	if want := idsOf(turns); !reflect.DeepEqual(stored, want) {
		t.Fatalf("full history turns:\n got %v\nwant %v", stored, want)
	}
	if len(summaries) != 1 {
		t.Fatalf("%d summaries in the full history, want 1", len(summaries))
	}
	if len(eff) >= len(full) {
		t.Fatalf("effective history (%d) is not shorter than the full one (%d)", len(eff), len(full))
	}

	st, err := c.status(conv)
	if err != nil {
		t.Fatal(err)
	}
	if st.ProfileID != profile || st.ContextWindow != 16000 || st.Threshold != 60 ||
		st.Condensations != 1 || st.Messages != len(full) || st.HiddenMessages != len(full)-len(eff) ||
		st.ContextTokens <= 0 || st.ContextTokens >= 9600 {
		t.Fatalf("status %+v (full %d, effective %d)", st, len(full), len(eff))
	}
	if _, err := c.status("no-such-conv"); !isQueryCode(err, schema.QueryNotFound) {
		t.Fatalf("status of an unknown conversation: %v", err)
	}

	// The relay publishes after the commit: flush it, then read the stream.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.relays.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	evs := readEvents(t, svc.js, "ctx.events.acme."+conv+".>")
	var cc []*schema.CondenseContext
	for _, e := range evs {
		if e.msgID != e.ev.Header().ID {
			t.Fatalf("Nats-Msg-Id %q, event id %q", e.msgID, e.ev.Header().ID)
		}
		if x, ok := e.ev.(*schema.CondenseContext); ok {
			cc = append(cc, x)
		}
	}
	if len(cc) != 1 {
		t.Fatalf("%d condense_context events, want 1 (%d events)", len(cc), len(evs))
	}
	if e := cc[0]; e.ConversationID != "acme."+conv || e.Trigger != schema.TriggerAuto || e.CondenseID != summaries[0].CondenseID ||
		e.PrevContextTokens < 9600 || e.NewContextTokens >= e.PrevContextTokens || e.Summary == "" {
		t.Fatalf("condense_context %+v", e)
	}

	base := "http://" + m.Config.HTTP
	if code, body := httpGet(t, base+"/healthz"); code != http.StatusOK || strings.TrimSpace(body) != "ok" {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	// The dashboard is mounted at /, and lists the conversation.
	if code, body := httpGet(t, base+"/"); code != http.StatusOK || !strings.Contains(strings.ToLower(body), "<html") {
		t.Fatalf("/: %d %.200q", code, body)
	}
	if code, body := httpGet(t, base+"/api/conversations"); code != http.StatusOK || !strings.Contains(body, "acme."+conv) {
		t.Fatalf("/api/conversations: %d %.300q", code, body)
	}
	// The profiles go tool pprof and go tool trace fetch are served
	// (symbolization needs /debug/pprof/symbol); the command line is not,
	// since it may hold a password.
	for p, want := range map[string]int{"/debug/pprof/": 200, "/debug/pprof/symbol": 200, "/debug/pprof/heap": 200,
		"/debug/pprof/trace?seconds=0.05": 200, "/debug/pprof/cmdline": 404} {
		if code, body := httpGet(t, base+p); code != want {
			t.Fatalf("%s: %d %.200q, want %d", p, code, body, want)
		}
	}
	// Metrics and profiles answer only to the service's names; health
	// answers any.
	for p, want := range map[string]int{"/metrics": 421, "/debug/pprof/heap": 421, "/api/conversations": 421, "/healthz": 200} {
		req, _ := http.NewRequest(http.MethodGet, base+p, nil)
		req.Host = "attacker.example"
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("%s as attacker.example: %d, want %d", p, resp.StatusCode, want)
		}
	}
	code, body := httpGet(t, base+"/metrics")
	if code != http.StatusOK || !strings.Contains(body, `ctxpipe_inputs_total{outcome="applied"} 20`) ||
		!strings.Contains(body, "ctxpipe_conversations 1") {
		t.Fatalf("/metrics: %d\n%s", code, body)
	}

	if err := m.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}

	// A clean restart on the same data dir keeps the history, the state
	// and the consumer's position.
	m2 := mustRunMain(t, dir)
	c2 := connectAs(t, m2.ns.ClientURL(), "acme-agent")
	if got := c2.mustHistory(conv, schema.ViewFull, ""); !reflect.DeepEqual(got, full) {
		t.Fatalf("full history after the restart differs: %d messages, had %d", len(got), len(full))
	}
	if st2, err := c2.status(conv); err != nil || !reflect.DeepEqual(st2, st) {
		t.Fatalf("status after the restart %+v (%v), before %+v", st2, err, st)
	}
	next := textTurn(rng, conv, profile, 20, last.TS+1000, 50)
	c2.publishTurn(next)
	if got := c2.mustHistory(conv, schema.ViewFull, next.ID); len(got) != len(full)+1 || got[len(got)-1].ID != next.ID {
		t.Fatalf("after the restart: %d messages", len(got))
	}
	// The old inputs were acked before the stop: only the new one applies.
	if n := m2.metrics.Value("ctxpipe_inputs_total", `outcome="applied"`); n != 1 {
		t.Fatalf("%v inputs applied after the restart, want 1", n)
	}
	// The dashboard's buttons publish tenant-qualified control inputs as
	// the service: nats.conf (which the embedded server runs) must let it.
	resp, err := http.Post("http://"+m2.Config.HTTP+"/api/conversations/acme."+conv+"/condense", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("dashboard condense: %d %s", resp.StatusCode, b)
	}
	if err := m2.Close(); err != nil {
		t.Fatalf("close after the restart: %v", err)
	}
}

func isQueryCode(err error, code schema.QueryCode) bool {
	qe, ok := err.(*schema.QueryErrorBody)
	return ok && qe.Code == code
}

func idsOf(turns []schema.Turn) []string {
	out := make([]string, len(turns))
	for i, tn := range turns {
		out[i] = tn.ID
	}
	return out
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func TestParseFlags(t *testing.T) {
	t.Setenv("NATS_URL", "")
	tests := []struct {
		name    string
		args    []string
		wantErr string // "" = no error
		check   func(t *testing.T, c Config)
	}{
		{name: "defaults run embedded", args: nil, check: func(t *testing.T, c Config) {
			if c.NATS.URL != "" || c.DataDir != "data" || c.Listen != "127.0.0.1:4222" || c.Globals.AutoCondensePercent != 100 {
				t.Fatalf("config %+v", c)
			}
		}},
		{name: "flags set the config", args: []string{"--data-dir", "/tmp/x", "--listen", "127.0.0.1:-1", "--http", "",
			"--lanes", "8", "--condense-percent", "70", "--ack-wait", "4s", "--profiles", "p.json"},
			check: func(t *testing.T, c Config) {
				if c.DataDir != "/tmp/x" || c.Listen != "127.0.0.1:-1" || c.HTTP != "" || c.Pipeline.Lanes != 8 ||
					c.Globals.AutoCondensePercent != 70 || c.Pipeline.AckWait != 4*time.Second || c.ProfilesFile != "p.json" || c.NATS.URL != "" {
					t.Fatalf("config %+v", c)
				}
			}},
		{name: "nats url connects out", args: []string{"--nats-url", "nats://127.0.0.1:4333"}, check: func(t *testing.T, c Config) {
			if c.NATS.URL != "nats://127.0.0.1:4333" {
				t.Fatalf("nats url %q", c.NATS.URL)
			}
		}},
		{name: "condense percent too low", args: []string{"--condense-percent", "3"}, wantErr: "--condense-percent 3"},
		{name: "condense percent too high", args: []string{"--condense-percent", "101"}, wantErr: "--condense-percent 101"},
		{name: "unexpected argument", args: []string{"--lanes", "2", "extra"}, wantErr: "unexpected arguments"},
		{name: "unknown flag", args: []string{"--no-such-flag"}, wantErr: "no-such-flag"},
		{name: "bad duration", args: []string{"--ack-wait", "soon"}, wantErr: "ack-wait"},
		{name: "ack wait too short", args: []string{"--ack-wait", "10ms"}, wantErr: "ack wait"},
		{name: "max deliver too small", args: []string{"--max-deliver", "1"}, wantErr: "max deliver"},
		{name: "partitions default", args: nil, check: func(t *testing.T, c Config) {
			if c.Partitions != bus.DefaultPartitions {
				t.Fatalf("partitions %d, want %d", c.Partitions, bus.DefaultPartitions)
			}
		}},
		{name: "partitions set", args: []string{"--partitions", "48"}, check: func(t *testing.T, c Config) {
			if c.Partitions != 48 {
				t.Fatalf("partitions %d, want 48", c.Partitions)
			}
		}},
		{name: "no partitions", args: []string{"--partitions", "0"}, wantErr: "--partitions 0"},
		{name: "negative partitions", args: []string{"--partitions", "-16"}, wantErr: "--partitions -16"},
		{name: "too many partitions", args: []string{"--partitions", "1025"}, wantErr: "--partitions 1025"},
		{name: "partitions overflowing", args: []string{"--partitions", "99999999999999999999"}, wantErr: "partitions"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := NewMain()
			err := m.ParseFlags(tt.args)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				tt.check(t, m.Config)
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err %v, want one mentioning %q", err, tt.wantErr)
			}
		})
	}
}

func TestRunRejectsBadProfiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name, file, want string
	}{
		{"missing file", filepath.Join(dir, "absent.json"), "absent.json"},
		{"not json", write("garbage.json", `{"id": oops`), "garbage.json"},
		{"not an array", write("object.json", `{"id":"x","context_window":1000}`), "object.json"},
		{"invalid profile", write("invalid.json", `[{"id":"x","context_window":0}]`), "invalid.json"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := NewMain()
			m.Config.DataDir = t.TempDir()
			m.Config.Listen = "" // no TCP listener: in-process clients only
			m.Config.HTTP = ""
			m.Config.ProfilesFile = tt.file
			m.Log = testLogger(t)
			err := m.Run(context.Background())
			if cerr := m.Close(); cerr != nil {
				t.Errorf("close after a failed run: %v", cerr)
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("run: %v, want an error naming %s", err, tt.want)
			}
		})
	}
}

// --help gives the service's default for --nats-url, its embedded server,
// not the clients' local URL (which a user would take for a broker to run).
func TestHelpNamesTheEmbeddedServer(t *testing.T) {
	t.Setenv("NATS_URL", "")
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := os.Stderr
	os.Stderr = w
	err = NewMain().ParseFlags([]string{"--help"})
	os.Stderr = stderr
	w.Close()
	out, _ := io.ReadAll(r)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	help := string(out)
	i := strings.Index(help, "\n  -nats-url ")
	if i < 0 {
		t.Fatalf("no --nats-url in the help:\n%s", help)
	}
	entry, _, _ := strings.Cut(help[i:], "\n  -nats-user")
	if strings.Contains(entry, "4222") || !strings.Contains(entry, "embedded server") {
		t.Fatalf("--nats-url's help: %q", entry)
	}
}
