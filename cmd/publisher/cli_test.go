package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/client/clienttest"
	"github.com/ctxpipe/ctxpipe/internal/natstest"
	"github.com/ctxpipe/ctxpipe/schema"
)

// env is a JetStream server with CTX_IN and CTX_EVENTS, as ctxpipe makes them.
type env struct {
	url string
	nc  *nats.Conn
	js  jetstream.JetStream
	ctx context.Context
}

func newEnv(t *testing.T) *env { return newEnvB(t) }

func newEnvB(t testing.TB) *env {
	t.Helper()
	_, url := natstest.Run(t)
	nc := natstest.Connect(t, url)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	if err := bus.EnsureStreams(ctx, js); err != nil {
		t.Fatal(err)
	}
	return &env{url: url, nc: nc, js: js, ctx: ctx}
}

// syncBuffer is a bytes.Buffer safe to read while a command writes to it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// cli runs the publisher in process with --nats-url pointing at the server.
func (e *env) cli(t *testing.T, ctx context.Context, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb syncBuffer
	if len(args) > 0 && args[0] != "help" {
		args = append([]string{args[0], "--nats-url", e.url}, args[1:]...)
	}
	code = run(ctx, args, &out, &errb)
	return code, out.String(), errb.String()
}

// stored returns the messages CTX_IN holds on subject, oldest first.
// storedIDs are the input ids of stored turns, in stream order.
func storedIDs(t *testing.T, msgs []*jetstream.RawStreamMsg) []string {
	t.Helper()
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		in, err := schema.DecodeInput(m.Subject, m.Data)
		if err != nil {
			t.Fatalf("stored turn %d: %v", i, err)
		}
		ids[i] = in.ID
	}
	return ids
}

func (e *env) stored(t *testing.T, subject string) []*jetstream.RawStreamMsg {
	t.Helper()
	s, err := e.js.Stream(e.ctx, bus.StreamIn)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(e.ctx, seq)
		if err != nil {
			t.Fatalf("get %d: %v", seq, err)
		}
		if m.Subject == subject {
			out = append(out, m)
		}
	}
	return out
}

var dupRe = regexp.MustCompile(`(\d[\d,]*) duplicates`)

func duplicates(t *testing.T, stderr string) string {
	t.Helper()
	m := dupRe.FindStringSubmatch(stderr)
	if m == nil {
		t.Fatalf("no summary in %q", stderr)
	}
	return m[1]
}

func TestPublishRealTranscript(t *testing.T) {
	e := newEnv(t)
	const name = "sweagent_demo_marshmallow-code__marshmallow-1867"
	file := filepath.Join(transcripts, name+".jsonl")
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	src, err := ParseTranscript(data, FormatTurns)
	if err != nil {
		t.Fatal(err)
	}
	system, err := os.ReadFile(filepath.Join(transcripts, name+".system.txt"))
	if err != nil {
		t.Fatal(err)
	}

	code, _, stderr := e.cli(t, e.ctx, "publish", file, "--conv", name, "--profile", "small")
	if code != 0 {
		t.Fatalf("publish exit %d: %s", code, stderr)
	}
	if got := duplicates(t, stderr); got != "0" {
		t.Fatalf("first publish reported %s duplicates", got)
	}
	msgs := e.stored(t, schema.InputSubject(name, schema.KindTurn))
	if len(msgs) != len(src.Turns) {
		t.Fatalf("stream holds %d turns, want %d", len(msgs), len(src.Turns))
	}
	for i, m := range msgs {
		in, err := schema.DecodeInput(m.Subject, m.Data)
		if err != nil {
			t.Fatalf("stored turn %d does not decode: %v", i, err)
		}
		// Same conversation: the file's ids are kept, in order, each in
		// its Nats-Msg-Id with a part of the connection's own (bus.MsgID).
		if in.ID != src.Turns[i].ID || !strings.HasPrefix(m.Header.Get(jetstream.MsgIDHeader), in.ID+"/") {
			t.Fatalf("turn %d: id %s header %s, want %s", i, in.ID, m.Header.Get(jetstream.MsgIDHeader), src.Turns[i].ID)
		}
		if in.Turn.ProfileID != "small" || in.Turn.SystemPrompt != strings.TrimRight(string(system), "\n") {
			t.Fatalf("turn %d: profile %q, system prompt %q", i, in.Turn.ProfileID, in.Turn.SystemPrompt)
		}
	}

	// The same file again: the same ids again, on another connection (as
	// from another process), so stored again, and applied once by the
	// service.
	code, _, stderr = e.cli(t, e.ctx, "publish", "--conv", name, file)
	if code != 0 {
		t.Fatalf("second publish exit %d: %s", code, stderr)
	}
	again := storedIDs(t, e.stored(t, schema.InputSubject(name, schema.KindTurn)))
	if first := storedIDs(t, msgs); !slices.Equal(again, append(first, first...)) {
		t.Fatalf("re-publish stored %d turns, not the %d ids again", len(again)-len(first), len(first))
	}
}

func TestPublishOpenAIWithWait(t *testing.T) {
	e := newEnv(t)
	file := filepath.Join(t.TempDir(), "chat.json")
	if err := os.WriteFile(file, []byte(openAIChat), 0o600); err != nil {
		t.Fatal(err)
	}
	// A stand-in for ctxpipe's history responder that checks wait_for.
	var lastID string
	var mu sync.Mutex
	sub, err := e.nc.QueueSubscribe(schema.SubjectHistory, bus.QueueGroup, func(m *nats.Msg) {
		var req schema.HistoryRequest
		_ = json.Unmarshal(m.Data, &req)
		msgs := e.stored(t, schema.InputSubject(req.ConversationID, schema.KindTurn))
		last := schema.PeekID(msgs[len(msgs)-1].Data)
		mu.Lock()
		lastID = req.WaitFor
		mu.Unlock()
		if req.WaitFor != last || req.View != schema.ViewEffective {
			_ = m.Respond(schema.MarshalQueryError(schema.QueryBadRequest, "wait_for is not the last turn"))
			return
		}
		b, _ := schema.Marshal(schema.HistoryReply{ConversationID: req.ConversationID, View: req.View, Messages: make([]schema.Message, 3)})
		_ = m.Respond(b)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := e.nc.Flush(); err != nil { // the responder is known to the server first
		t.Fatal(err)
	}

	code, stdout, stderr := e.cli(t, e.ctx, "publish", "--conv", "oa", "--wait", file)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(stdout, "oa: 3 effective messages") {
		t.Fatalf("stdout %q", stdout)
	}
	msgs := e.stored(t, "ctx.in.oa.turn")
	if len(msgs) != 4 {
		t.Fatalf("%d turns stored, want 4", len(msgs))
	}
	mu.Lock()
	defer mu.Unlock()
	if ids := storedIDs(t, msgs); lastID != ids[3] {
		t.Fatalf("wait_for %s, want %s", lastID, ids[3])
	}
	var turn schema.Turn
	if err := json.Unmarshal(msgs[1].Data, &turn); err != nil {
		t.Fatal(err)
	}
	if turn.SystemPrompt != "You are a coding agent." || !strings.Contains(string(turn.Content.Blocks[1].Input), `"go test ./..."`) {
		t.Fatalf("stored assistant turn %s", msgs[1].Data)
	}

	// A converted file has no ids of its own: they are derived from the
	// conversation and the turns' places, so publishing it again (a retry
	// after a partial failure, say) sends the same ids, which the service
	// applies once (another connection's copies are stored again).
	code, _, stderr = e.cli(t, e.ctx, "publish", "--conv", "oa", file)
	first := storedIDs(t, msgs)
	if again := storedIDs(t, e.stored(t, "ctx.in.oa.turn")); code != 0 || !slices.Equal(again, append(first, first...)) {
		t.Fatalf("re-publish: exit %d, ids %v, want %v twice; %s", code, again, first, stderr)
	}
}

func TestPublishErrors(t *testing.T) {
	_, url := natstest.Run(t) // no streams
	file := filepath.Join(t.TempDir(), "chat.json")
	if err := os.WriteFile(file, []byte(openAIChat), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no stream", []string{"publish", "--nats-url", url, "--conv", "c", file}, 1, "no stream"},
		{"no conv", []string{"publish", "--nats-url", url, file}, 2, "--conv is required"},
		{"no file", []string{"publish", "--nats-url", url, "--conv", "c"}, 2, "exactly one"},
		{"missing file", []string{"publish", "--nats-url", url, "--conv", "c", "/nonexistent.jsonl"}, 1, "no such file"},
		{"bad format", []string{"publish", "--nats-url", url, "--conv", "c", "--format", "xml", file}, 2, "unknown format"},
		{"bad conv", []string{"publish", "--nats-url", url, "--conv", "a.b", file}, 2, "must be"},
		{"unknown command", []string{"frobnicate"}, 2, "unknown command"},
		{"rewind without ts", []string{"rewind", "--nats-url", url, "--conv", "c"}, 2, "--ts is required"},
		{"bad view", []string{"history", "--nats-url", url, "--conv", "c", "--view", "all"}, 2, "view must be"},
		{"no responders", []string{"status", "--nats-url", url, "--conv", "c"}, 1, "no responders"},
		{"load sizes", []string{"load", "--nats-url", url, "--size", "huge"}, 2, "unknown size"},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errb syncBuffer
			code := run(ctx, tt.args, &out, &errb)
			if code != tt.code || !strings.Contains(errb.String(), tt.want) {
				t.Fatalf("exit %d, stderr %q; want exit %d mentioning %q", code, errb.String(), tt.code, tt.want)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	var out, errb syncBuffer
	if code := run(context.Background(), []string{"help"}, &out, &errb); code != 0 {
		t.Fatalf("help exit %d", code)
	}
	for name := range commands {
		if !strings.Contains(out.String(), "  "+name+" ") {
			t.Errorf("help does not list %s", name)
		}
	}
}

func TestLoad(t *testing.T) {
	e := newEnv(t)
	args := []string{"load", "--convs", "3", "--turns", "12", "--size", "small", "--seed", "7", "--profile", "p"}
	code, _, stderr := e.cli(t, e.ctx, args...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(stderr, "p50") || duplicates(t, stderr) != "0" {
		t.Fatalf("summary %q", stderr)
	}
	for i := range 3 {
		subj := schema.InputSubject(convName(7, i), schema.KindTurn)
		msgs := e.stored(t, subj)
		want := GenerateTurns(7, convName(7, i), 12, SizeSmall)
		if len(msgs) != 12 {
			t.Fatalf("%s holds %d turns, want 12", subj, len(msgs))
		}
		for j, m := range msgs {
			in, err := schema.DecodeInput(m.Subject, m.Data)
			if err != nil {
				t.Fatalf("%s turn %d: %v", subj, j, err)
			}
			// Same ids as the pure generator, in conversation order.
			if in.ID != want[j].ID || in.Turn.ProfileID != "p" {
				t.Fatalf("%s turn %d: id %s, want %s", subj, j, in.ID, want[j].ID)
			}
		}
	}
	// Deterministic with --seed: the same run again sends the same ids
	// (stored again: another connection).
	code, _, stderr = e.cli(t, e.ctx, args...)
	if code != 0 {
		t.Fatalf("second load: exit %d, %s", code, stderr)
	}
	for i := range 3 {
		subj := schema.InputSubject(convName(7, i), schema.KindTurn)
		ids := storedIDs(t, e.stored(t, subj))
		if len(ids) != 24 || !slices.Equal(ids[:12], ids[12:]) {
			t.Fatalf("%s after the second load: %d turns, not the 12 ids twice", subj, len(ids))
		}
	}
}

func TestLoadWait(t *testing.T) {
	e := newEnv(t)
	sub, err := e.nc.QueueSubscribe(schema.SubjectHistory, bus.QueueGroup, func(m *nats.Msg) {
		var req schema.HistoryRequest
		_ = json.Unmarshal(m.Data, &req)
		b, _ := schema.Marshal(schema.HistoryReply{ConversationID: req.ConversationID, View: req.View})
		_ = m.Respond(b)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := e.nc.Flush(); err != nil { // the responder is known to the server first
		t.Fatal(err)
	}
	code, _, stderr := e.cli(t, e.ctx, "load", "--convs", "4", "--turns", "5", "--size", "small", "--wait")
	if code != 0 || !strings.Contains(stderr, "end to end: 4/4 conversations readable") {
		t.Fatalf("exit %d: %s", code, stderr)
	}
}

func TestControlInputs(t *testing.T) {
	e := newEnv(t)
	tests := []struct {
		kind    schema.InputKind
		args    []string
		trigger schema.Trigger
		ts      int64
		include bool
	}{
		{schema.KindCondense, []string{"--instructions", "keep the failing test's name"}, schema.TriggerManual, 0, false},
		{schema.KindOverflow, nil, schema.TriggerForced, 0, false},
		{schema.KindRewind, []string{"--ts", "1732250000000", "--include-target"}, "", 1732250000000, true},
		{schema.KindPin, []string{"--message", "0b6c7a9e-1d2f-4c3b-9a8e-7f6d5c4b3a21", "--unpin"}, "", 0, false},
	}
	for _, tt := range tests {
		t.Run(string(tt.kind), func(t *testing.T) {
			// No service here: nothing would answer the wait.
			code, stdout, stderr := e.cli(t, e.ctx, append([]string{string(tt.kind), "--conv", "c9", "--wait=false"}, tt.args...)...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			id := strings.TrimSpace(stdout)
			if _, err := uuid.Parse(id); err != nil {
				t.Fatalf("stdout %q is not an input id", stdout)
			}
			msgs := e.stored(t, schema.InputSubject("c9", tt.kind))
			if len(msgs) != 1 {
				t.Fatalf("%d messages stored", len(msgs))
			}
			in, err := schema.DecodeInput(msgs[0].Subject, msgs[0].Data)
			if err != nil {
				t.Fatal(err)
			}
			if in.ID != id || !strings.HasPrefix(msgs[0].Header.Get(jetstream.MsgIDHeader), id+"/") || in.Trigger != tt.trigger || in.IncludeTarget != tt.include {
				t.Fatalf("stored %s: %+v", msgs[0].Data, in)
			}
			if tt.ts != 0 && in.TS != tt.ts {
				t.Fatalf("ts %d, want %d", in.TS, tt.ts)
			}
			switch tt.kind {
			case schema.KindCondense:
				if in.Instructions != "keep the failing test's name" {
					t.Fatalf("instructions %q", in.Instructions)
				}
			case schema.KindPin:
				if in.MessageID != "0b6c7a9e-1d2f-4c3b-9a8e-7f6d5c4b3a21" || in.Pinned {
					t.Fatalf("pin %+v", in)
				}
			}
		})
	}
	for _, args := range [][]string{{"rewind", "--conv", "c9", "--ts", "-5"}, {"pin", "--conv", "c9"}} {
		if code, _, stderr := e.cli(t, e.ctx, args...); code != 2 || !strings.Contains(stderr, "--") {
			t.Errorf("%v: exit %d: %s", args, code, stderr)
		}
	}
}

// By default a control command waits for the input's outcome: a rejection
// exits 1 with its reason (a rewind the service rejects unknown_target
// does not say "published" and exit 0).
func TestControlWaitsForTheOutcome(t *testing.T) {
	e := newEnv(t)
	sub, err := e.nc.QueueSubscribe(schema.SubjectHistory, bus.QueueGroup, func(m *nats.Msg) {
		var req schema.HistoryRequest
		_ = json.Unmarshal(m.Data, &req)
		if req.WaitFor == "" {
			_ = m.Respond(schema.MarshalQueryError(schema.QueryBadRequest, "no wait_for"))
			return
		}
		kind := ""
		for _, k := range []schema.InputKind{schema.KindCondense, schema.KindRewind} {
			for _, sm := range e.stored(t, schema.InputSubject("c9", k)) {
				if schema.PeekID(sm.Data) == req.WaitFor {
					kind = string(k)
				}
			}
		}
		switch kind {
		case "":
			_ = m.Respond(schema.MarshalQueryError(schema.QueryBadRequest, "wait_for is no input sent"))
			return
		case string(schema.KindRewind):
			_ = m.Respond(schema.MarshalQueryError(schema.QueryInputRejected, "input "+req.WaitFor+" was rejected: unknown_target"))
			return
		}
		b, _ := schema.Marshal(schema.HistoryReply{ConversationID: req.ConversationID, View: schema.ViewEffective, Messages: make([]schema.Message, 1)})
		_ = m.Respond(b)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := e.cli(t, e.ctx, "condense", "--conv", "c9"); code != 0 || !strings.Contains(stderr, "applied condense") {
		t.Fatalf("condense: exit %d: %s", code, stderr)
	}
	if code, _, stderr := e.cli(t, e.ctx, "rewind", "--conv", "c9", "--ts", "5"); code != 1 || !strings.Contains(stderr, "unknown_target") {
		t.Fatalf("rejected rewind: exit %d: %s", code, stderr)
	}
}

func TestQueries(t *testing.T) {
	e := newEnv(t)
	respond := func(m *nats.Msg) {
		var req struct {
			ConversationID string `json:"conversation_id"`
		}
		_ = json.Unmarshal(m.Data, &req)
		if req.ConversationID == "missing" {
			_ = m.Respond(schema.MarshalQueryError(schema.QueryNotFound, "no conversation missing"))
			return
		}
		var b []byte
		if m.Subject == schema.SubjectStatus {
			b, _ = schema.Marshal(schema.StatusReply{ConversationID: req.ConversationID, ProfileID: "default",
				ContextTokens: 12345, ContextWindow: 16000, AllowedTokens: 7808, Percent: 77.2, Threshold: 75,
				Messages: 40, HiddenMessages: 30, Condensations: 2, Truncations: 1})
		} else {
			summary := schema.Message{Turn: schema.Turn{ID: uuid.NewString(), TS: 1732250000000, Role: schema.RoleUser,
				Content: schema.TextContent("Summary of the conversation so far:\n the agent fixed the failing test in store/ and ...")},
				IsSummary: true, CondenseID: "x", Tokens: 812}
			hidden := schema.Message{Turn: schema.Turn{ID: uuid.NewString(), TS: 1732250001000, Role: schema.RoleAssistant,
				Content: schema.BlockContent(schema.Block{Type: schema.BlockToolUse, ID: "t1", Name: "bash", Input: json.RawMessage(`{"command":"ls"}`)})},
				CondenseParent: "x", Tokens: 20}
			b, _ = schema.Marshal(schema.HistoryReply{ConversationID: req.ConversationID, View: schema.ViewFull, Messages: []schema.Message{summary, hidden}})
		}
		_ = m.Respond(b)
	}
	for _, s := range []string{schema.SubjectHistory, schema.SubjectStatus} {
		sub, err := e.nc.QueueSubscribe(s, bus.QueueGroup, respond)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
	}
	// The subscriptions must reach the server before the CLI's first
	// request does (another connection): without this the first one could
	// find no responder (seen once in CI).
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		code int
		out  []string // in stdout
		err  string   // in stderr
	}{
		{"history", []string{"history", "--conv", "c1", "--view", "full"}, 0,
			[]string{"[summary]", "[condensed]", "812", `bash{"command":"ls"}`, "Summary of the conversation so far: the agent", "2 messages (full view), 832 tokens"}, ""},
		{"history json", []string{"history", "--conv", "c1", "--json"}, 0, []string{`"is_summary":true`, `"condense_parent":"x"`}, ""},
		{"status", []string{"status", "--conv", "c1"}, 0, []string{"12,345 / 16,000 tokens (77.2%; allowed 7,808, threshold 75%)", "40 (30 hidden)"}, ""},
		{"status json", []string{"status", "--conv", "c1", "--json"}, 0, []string{`"context_tokens":12345`}, ""},
		{"history error reply", []string{"history", "--conv", "missing"}, 1, nil, "not_found: no conversation missing"},
		{"status error reply", []string{"status", "--conv", "missing", "--json"}, 1, nil, "not_found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := e.cli(t, e.ctx, tt.args...)
			if code != tt.code {
				t.Fatalf("exit %d, want %d: %s", code, tt.code, stderr)
			}
			for _, w := range tt.out {
				if !strings.Contains(stdout, w) {
					t.Errorf("stdout lacks %q:\n%s", w, stdout)
				}
			}
			if !strings.Contains(stderr, tt.err) {
				t.Errorf("stderr %q lacks %q", stderr, tt.err)
			}
		})
	}
}

// publishEvent stands in for ctxpipe's outbox relay.
func (e *env) publishEvent(t *testing.T, ev schema.Event) {
	t.Helper()
	b, err := schema.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.js.Publish(e.ctx, schema.EventSubject(ev), b, jetstream.WithMsgID(ev.Header().ID)); err != nil {
		t.Fatal(err)
	}
}

func condenseEvent(conv string, prev, next int) *schema.CondenseContext {
	return &schema.CondenseContext{
		EventHeader: schema.EventHeader{ID: uuid.NewString(), Type: schema.EventCondenseContext, ConversationID: conv,
			TS: time.Now().UnixMilli(), InputID: uuid.NewString()},
		CondenseID: uuid.NewString(), PrevContextTokens: prev, NewContextTokens: next, MessagesCondensed: 12,
		Trigger: schema.TriggerAuto, Cost: 0.0123,
	}
}

func TestReplay(t *testing.T) {
	e := newEnv(t)
	// The real service answers replays (ctx.q.events, from its SQLite): a
	// session that crosses a small window's threshold condenses.
	clienttest.New(t, clienttest.WithConn(bus.ConnConfig{URL: e.url}), clienttest.WithProfiles(schema.Profile{ID: "small", ContextWindow: 8000, MaxTokens: 500}))
	if code, _, stderr := e.cli(t, e.ctx, "publish", "--conv", "task-42", "--profile", "small", "--wait", "../../examples/sample-session.jsonl"); code != 0 {
		t.Fatalf("publish: exit %d: %s", code, stderr)
	}
	code, stdout, stderr := e.cli(t, e.ctx, "replay", "--conv", "task-42")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	condenses := 0
	for _, l := range lines {
		if !strings.Contains(l, " task-42 ") {
			t.Fatalf("a line of another conversation:\n%s", stdout)
		}
		if strings.Contains(l, "condense_context") && strings.Contains(l, "tokens (") {
			condenses++
		}
	}
	if condenses == 0 || !strings.Contains(stderr, fmt.Sprintf("task-42: %d events", len(lines))) {
		t.Fatalf("replay: %d condense lines of %d, stderr %q:\n%s", condenses, len(lines), stderr, stdout)
	}
	code, stdout, _ = e.cli(t, e.ctx, "replay", "--conv", "task-42", "--json")
	if code != 0 || strings.Count(stdout, `"type":`) != len(lines) || !strings.Contains(stdout, `"prev_context_tokens":`) {
		t.Fatalf("replay --json: exit %d\n%s", code, stdout)
	}
	// A conversation without events: nothing printed, and replay still ends.
	code, stdout, stderr = e.cli(t, e.ctx, "replay", "--conv", "quiet")
	if code != 0 || stdout != "" || !strings.Contains(stderr, "quiet: 0 events") {
		t.Fatalf("empty replay: exit %d, %q, %q", code, stdout, stderr)
	}
}

func TestFollow(t *testing.T) {
	e := newEnv(t)
	e.publishEvent(t, condenseEvent("old", 10, 5)) // before follow: only --all sees it

	tests := []struct {
		name string
		args []string
		want []string // substrings, in order
		not  string
	}{
		{"new events of one conversation", []string{"--conv", "task-1"}, []string{"task-1 condense_context 300→100"}, "old"},
		{"all events, json", []string{"--all", "--json"}, []string{`"conversation_id":"old"`, `"conversation_id":"task-1"`}, ""},
		{"new events of every conversation", []string{"--json"}, []string{`"conversation_id":"task-1"`}, `"conversation_id":"old"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := e.js.Stream(e.ctx, bus.StreamEvents)
			if err != nil {
				t.Fatal(err)
			}
			before := s.CachedInfo().State.Consumers
			ctx, cancel := context.WithCancel(e.ctx)
			defer cancel()
			var out, errb syncBuffer
			done := make(chan int, 1)
			go func() {
				done <- run(ctx, append([]string{"follow", "--nats-url", e.url}, tt.args...), &out, &errb)
			}()
			if tt.args[0] != "--all" {
				// One conversation follows through a core subscription
				// (the service's path, open to tenants): publish until
				// the subscription, which has no trace in the stream,
				// sees it.
				waitFor(t, func() bool {
					e.publishEvent(t, condenseEvent("skip-me", 1, 1))
					e.publishEvent(t, condenseEvent("task-1", 300, 100))
					time.Sleep(50 * time.Millisecond)
					return strings.Contains(out.String(), "task-1")
				}, "the followed event")
			} else {
				// DeliverNew: publish only once follow's consumer exists.
				waitFor(t, func() bool {
					info, err := s.Info(e.ctx)
					return err == nil && info.State.Consumers > before
				}, "follow's consumer")
				e.publishEvent(t, condenseEvent("skip-me", 1, 1))
				e.publishEvent(t, condenseEvent("task-1", 300, 100))
				waitFor(t, func() bool { return strings.Contains(out.String(), "task-1") }, "the followed event")
			}
			cancel()
			if code := <-done; code != 0 {
				t.Fatalf("follow exit %d: %s", code, errb.String())
			}
			got := out.String()
			at := 0
			for _, w := range tt.want {
				i := strings.Index(got[at:], w)
				if i < 0 {
					t.Fatalf("output lacks %q (in order):\n%s", w, got)
				}
				at += i
			}
			if tt.not != "" && strings.Contains(got, tt.not) {
				t.Fatalf("output has %q:\n%s", tt.not, got)
			}
			if strings.Contains(tt.args[0], "conv") && strings.Contains(got, "skip-me") {
				t.Fatalf("filter let another conversation through:\n%s", got)
			}
		})
	}
}

// waitFor polls cond; the 20 s bound only ends a broken test.
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// formatTS is when the events of the formatting tests happened.
var formatTS = time.Date(2025, 6, 15, 12, 1, 2, 0, time.UTC).UnixMilli()

// header is the header of an event of type typ at formatTS.
func header(typ schema.EventType) schema.EventHeader {
	return schema.EventHeader{ID: "e", Type: typ, ConversationID: "task-42", TS: formatTS, InputID: "0b6c7a9e-aaaa"}
}

// formatCase is an event and the line formatEvent writes for it.
type formatCase struct {
	ev   schema.Event
	want string
}

// checkFormat checks formatEvent's line for each case, in UTC.
func checkFormat(t *testing.T, cases []formatCase) {
	t.Helper()
	for _, tt := range cases {
		b, _ := schema.Marshal(tt.ev)
		if got := formatEvent(b, time.UTC); got != tt.want {
			t.Errorf("formatEvent =\n %q\nwant\n %q", got, tt.want)
		}
	}
}

func TestFormatEvent(t *testing.T) {
	checkFormat(t, []formatCase{
		{&schema.CondenseContext{EventHeader: header(schema.EventCondenseContext), PrevContextTokens: 182304, NewContextTokens: 41220,
			MessagesCondensed: 12, Trigger: schema.TriggerAuto, Cost: 0.0123},
			"12:01:02 task-42 condense_context 182,304→41,220 tokens (12 msgs, auto, $0.0123) input 0b6c7a9e"},
		{&schema.CondenseFailed{EventHeader: header(schema.EventCondenseFailed), Error: schema.ReasonContextGrew, Trigger: schema.TriggerManual},
			"12:01:02 task-42 condense_failed context_grew (manual, $0.0000) input 0b6c7a9e"},
		{&schema.ContextManaging{EventHeader: header(schema.EventContextManaging), Trigger: schema.TriggerAuto, ContextTokens: 12000, ContextWindow: 16000, Threshold: 75},
			"12:01:02 task-42 context_managing 12,000/16,000 tokens (75.0%, threshold 75%, auto) input 0b6c7a9e"},
		{&schema.Rewind{EventHeader: header(schema.EventRewind), CutoffTS: formatTS, MessagesRemoved: 3, MessagesRestored: 9, RemovedCondenseIDs: []string{"a"}},
			"12:01:02 task-42 rewind to 12:01:02.000 (3 msgs removed, 9 restored, 1 condenses and 0 truncations undone) input 0b6c7a9e"},
		{&schema.InputRejected{EventHeader: header(schema.EventInputRejected), Reason: schema.ReasonBadTS, Subject: "ctx.in.task-42.turn", Message: "ts must\nbe positive"},
			"12:01:02 task-42 input_rejected bad_ts on ctx.in.task-42.turn: ts must be positive input 0b6c7a9e"},
	})
}

// Against the repository's nats.conf, each user can send what it may, and a
// refused publish fails at once with the server's reason.
func TestPermissionsFromNATSConf(t *testing.T) {
	_, url := natstest.RunWithConfig(t, "../../nats.conf")
	nc := natstest.Connect(t, url, nats.UserInfo("ctxpipe", "ctxpipe-demo-password"))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := bus.EnsureStreams(ctx, js); err != nil {
		t.Fatal(err)
	}
	// The real service, as ctxpipe: replays go through its ctx.q.events.
	clienttest.New(t, clienttest.WithConn(bus.ConnConfig{URL: url, User: "ctxpipe", Password: "ctxpipe-demo-password"}))
	sample := "../../examples/sample-session.jsonl"
	tests := []struct {
		name   string
		user   string
		args   []string
		code   int
		stderr string
	}{
		{"agent publishes turns", "acme-agent", []string{"publish", "--conv", "s1", "--wait", sample}, 0, "0 duplicates"},
		{"agent reports overflow", "acme-agent", []string{"overflow", "--conv", "s1"}, 0, "published overflow"},
		{"agent may not condense", "acme-agent", []string{"condense", "--conv", "s1"}, 1, `Permissions Violation for Publish to "ctx.in.s1.condense"`},
		{"ui may not publish turns", "acme-ui", []string{"publish", "--conv", "s1", sample}, 1, `Permissions Violation for Publish to "ctx.in.s1.turn"`},
		{"ui condenses", "acme-ui", []string{"condense", "--conv", "s1"}, 0, "published condense"},
		{"ui rewinds", "acme-ui", []string{"rewind", "--conv", "s1", "--ts", "1750000000001"}, 0, "published rewind"},
		{"ui replays its tenant's events", "acme-ui", []string{"replay", "--conv", "s1"}, 0, "s1: "},
		{"another tenant finds nothing", "globex-ui", []string{"replay", "--conv", "s1"}, 0, "s1: 0 events"},
		{"a tenant cannot read CTX_EVENTS", "acme-ui", []string{"follow", "--all"}, 1, "Permissions Violation"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{tt.args[0], "--nats-url", url, "--nats-user", tt.user,
				"--nats-password", tt.user + "-demo-password"}, tt.args[1:]...)
			var out, errb syncBuffer
			code := run(ctx, args, &out, &errb)
			if code != tt.code || !strings.Contains(errb.String(), tt.stderr) {
				t.Fatalf("exit %d, stderr %q; want exit %d mentioning %q", code, errb.String(), tt.code, tt.stderr)
			}
		})
	}
}
