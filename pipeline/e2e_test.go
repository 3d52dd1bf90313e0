package pipeline_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	llm "github.com/ctxpipe/ctxpipe/condense"
	"github.com/ctxpipe/ctxpipe/engine"
	"github.com/ctxpipe/ctxpipe/internal/natstest"
	"github.com/ctxpipe/ctxpipe/internal/openaitest"
	"github.com/ctxpipe/ctxpipe/pipeline"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/store"
)

// harness runs the real pipeline: an in-process JetStream server, a SQLite
// file, an OpenAI-compatible httptest server behind go-openai, the relay and
// the query responders.
type harness struct {
	t       *testing.T
	nc      *nats.Conn
	js      jetstream.JetStream
	store   *store.Store // the only file, when there is one
	set     *store.Set
	ai      *openaitest.Server
	relay   *store.Relay // the only file's
	relays  []*store.Relay
	runner  *pipeline.Runner
	metrics *pipeline.Metrics
	ts      int64
	stop    func() // stops the runner and closes the files (also at cleanup)
	// stopRelays stops the relays, as if the instance died before its
	// relays sent what it committed.
	stopRelays context.CancelFunc
}

// smallProfile: window 4000, max_tokens 400 → allowed 3200; the global
// threshold is 75 % (3000 tokens).
func smallProfile(id string) schema.Profile {
	return schema.Profile{ID: id, ContextWindow: 4000, MaxTokens: 400,
		Prices: schema.Prices{InputPerMTok: 1, OutputPerMTok: 2}}
}

func start(t *testing.T, profiles ...schema.Profile) *harness {
	t.Helper()
	return startWith(t, pipeline.Config{Lanes: 4, AckWait: 5 * time.Second, MaxDeliver: 5, RetryBudget: time.Second}, profiles...)
}

func startWith(t *testing.T, cfg pipeline.Config, profiles ...schema.Profile) *harness {
	t.Helper()
	return startStore(t, cfg, nil, profiles...)
}

func startStore(t *testing.T, cfg pipeline.Config, storeOpts []store.Option, profiles ...schema.Profile) *harness {
	t.Helper()
	_, url := natstest.Run(t)
	return startOn(t, url, cfg, storeOpts, profiles...)
}

// startOn is startStore against the server at url.
func startOn(t *testing.T, url string, cfg pipeline.Config, storeOpts []store.Option, profiles ...schema.Profile) *harness {
	t.Helper()
	return startFiles(t, url, cfg, storeOpts, "", 1, profiles...)
}

// startFiles is startOn with the state split over files SQLite files in
// dir (a new directory when "").
func startFiles(t *testing.T, url string, cfg pipeline.Config, storeOpts []store.Option, dir string, files int, profiles ...schema.Profile) *harness {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	nc := natstest.Connect(t, url)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := bus.EnsureStreams(ctx, js); err != nil {
		t.Fatal(err)
	}
	if dir == "" {
		dir = t.TempDir()
	}
	set, err := store.OpenSet(ctx, dir, files, storeOpts...)
	if err != nil {
		t.Fatal(err)
	}
	ai := openaitest.New(t)
	log := slog.New(slog.DiscardHandler)
	if os.Getenv("E2E_LOG") != "" {
		log = slog.Default()
	}
	eng := engine.NewEngine(llm.NewRouter(llm.Config{BaseURL: ai.URL(), Model: "test-model", MaxAttempts: 1}, log))
	eng.Globals = schema.Globals{AutoCondense: true, AutoCondensePercent: 75}
	eng.Log = log
	eng.Progress = pipeline.ProgressPublisher(js, log)
	if len(profiles) == 0 {
		profiles = []schema.Profile{smallProfile(schema.DefaultProfileID)}
	}
	// The relay never polls: every event the tests wait for must leave
	// because the commit that stored it woke the relay. Another
	// instance's events are held a second at least (not 5), so that tests
	// of several instances see them released soon.
	var relays []*store.Relay
	for _, st := range set.Files() {
		relays = append(relays, store.NewRelay(st, pipeline.JetStreamPublisher{JS: js}, log,
			store.RelayOptions{PollInterval: time.Hour, Hold: time.Second}))
	}
	metrics := pipeline.NewMetrics()
	r, err := pipeline.New(cfg, pipeline.Deps{
		JS: js, Stores: set, Engine: eng, Profiles: pipeline.StaticProfiles(profiles...), Relays: relays, Log: log,
		Metrics: metrics,
	})
	if err != nil {
		t.Fatal(err)
	}
	stopQueries, err := r.ServeQueries(ctx, nc)
	if err != nil {
		t.Fatal(err)
	}
	relayDone, runDone := make(chan error, len(relays)), make(chan error, 1)
	relayCtx, stopRelays := context.WithCancel(ctx)
	for _, relay := range relays {
		go func() { relayDone <- relay.Run(relayCtx) }()
	}
	go func() { runDone <- r.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			<-runDone
			for range relays {
				<-relayDone
			}
			_ = stopQueries()
			_ = set.Close()
		})
	}
	t.Cleanup(stop)
	h := &harness{t: t, nc: nc, js: js, set: set, relays: relays, ai: ai, runner: r, metrics: metrics, ts: 1_700_000_000_000, stop: stop,
		stopRelays: stopRelays}
	if files == 1 {
		h.store, h.relay = set.File(0), relays[0]
	}
	return h
}

func (h *harness) nextTS() int64 { h.ts += 1000; return h.ts }

// turn publishes a turn of about n o200k tokens (before the 1.5 fudge).
func (h *harness) turn(conv string, role schema.Role, n int) schema.Turn {
	h.t.Helper()
	t := schema.Turn{ID: uuid.NewString(), ConversationID: conv, TS: h.nextTS(), Role: role,
		Content: schema.TextContent(strings.TrimSpace(strings.Repeat(" context", n)))}
	h.publish(schema.InputSubject(conv, schema.KindTurn), t.ID, t)
	return t
}

// turns publishes n turns of about size tokens, user and assistant in turn.
func (h *harness) turns(conv string, n, size int) []schema.Turn {
	h.t.Helper()
	out := make([]schema.Turn, n)
	for i := range out {
		role := schema.RoleUser
		if i%2 == 1 {
			role = schema.RoleAssistant
		}
		out[i] = h.turn(conv, role, size)
	}
	return out
}

func (h *harness) publish(subject, id string, v any) {
	h.t.Helper()
	data, err := schema.Marshal(v)
	if err != nil {
		h.t.Fatal(err)
	}
	h.publishRaw(subject, id, data)
}

func (h *harness) publishRaw(subject, id string, data []byte) {
	h.t.Helper()
	if _, err := bus.PublishInput(context.Background(), h.js, subject, id, data); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) control(conv string, kind schema.InputKind, in schema.Input) string {
	h.t.Helper()
	in.ID, in.ConversationID = uuid.NewString(), conv
	if in.TS == 0 {
		in.TS = h.nextTS()
	}
	data, err := schema.ControlPayload(in)
	if err != nil {
		h.t.Fatal(err)
	}
	h.publishRaw(schema.InputSubject(conv, kind), in.ID, data)
	return in.ID
}

// history asks ctx.q.history, waiting for the input waitFor.
func (h *harness) history(conv string, view schema.View, waitFor string) []schema.Message {
	h.t.Helper()
	req, _ := json.Marshal(schema.HistoryRequest{ConversationID: conv, View: view, WaitFor: waitFor, TimeoutMS: 10000})
	msg, err := h.nc.Request(schema.SubjectHistory, req, 15*time.Second)
	if err != nil {
		h.t.Fatal(err)
	}
	checkHistoryJSON(h.t, req, msg.Data)
	var qe schema.QueryError
	if json.Unmarshal(msg.Data, &qe) == nil && qe.Error.Code != "" {
		h.t.Fatalf("history: %s", qe.Error.Error())
	}
	var rep schema.HistoryReply
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		h.t.Fatal(err)
	}
	// The reply splices stored bodies; it must be byte for byte what
	// encoding the reply afresh gives.
	again := rep
	if again.Messages == nil {
		again.Messages = []schema.Message{}
	}
	if again, err := schema.Marshal(again); err != nil || string(again) != string(msg.Data) {
		h.t.Fatalf("history reply differs from its own re-encoding (%v):\n%s\n%s", err, msg.Data, again)
	}
	if view == schema.ViewEffective {
		// The query reads only visible rows; it must agree with the engine's
		// rule over the whole stored history.
		all, err := h.store.Messages(context.Background(), conv)
		if err != nil {
			h.t.Fatal(err)
		}
		want := engine.EffectiveHistory(all)
		if len(want)+len(rep.Messages) > 0 && !reflect.DeepEqual(rep.Messages, want) {
			h.t.Fatalf("effective view: the query returned %d messages, EffectiveHistory of the stored history %d", len(rep.Messages), len(want))
		}
	}
	return rep.Messages
}

func (h *harness) status(conv string) schema.StatusReply {
	h.t.Helper()
	req, _ := json.Marshal(schema.StatusRequest{ConversationID: conv})
	msg, err := h.nc.Request(schema.SubjectStatus, req, 5*time.Second)
	if err != nil {
		h.t.Fatal(err)
	}
	var rep schema.StatusReply
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		h.t.Fatal(err)
	}
	return rep
}

// events reads every event of conv from CTX_EVENTS, after the outbox is flushed.
func (h *harness) events(conv string) []schema.Event {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.relay.Flush(ctx); err != nil {
		h.t.Fatal(err)
	}
	return readEvents(ctx, h.t, h.js, "ctx.events."+conv+".>")
}

func readEvents(ctx context.Context, t *testing.T, js jetstream.JetStream, filter string) []schema.Event {
	t.Helper()
	cons, err := js.OrderedConsumer(ctx, bus.StreamEvents, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []schema.Event
	for left := info.NumPending; left > 0; left-- {
		m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		ev, err := schema.DecodeEvent(m.Data())
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Headers().Get(jetstream.MsgIDHeader); got != ev.Header().ID {
			t.Fatalf("Nats-Msg-Id %q, event id %q", got, ev.Header().ID)
		}
		out = append(out, ev)
	}
	return out
}

// eventTypes lists the types; context_managing may arrive before the
// previous input's outbox events (it is published at once), so tests that
// care about order compare within one input.
func eventTypes(evs []schema.Event, input string) []schema.EventType {
	var out []schema.EventType
	for _, e := range evs {
		if input == "" || e.Header().InputID == input {
			out = append(out, e.Header().Type)
		}
	}
	return out
}

func tokensOf(msgs []schema.Message) int {
	n := 0
	for _, m := range msgs {
		n += m.Tokens
	}
	return n
}

func TestCondenseEndToEnd(t *testing.T) {
	h := start(t)
	const conv = "task-42"
	// ~300 tokens a turn after the fudge: the 10th turn crosses 75 % (3000).
	ts := h.turns(conv, 10, 200)
	last := ts[len(ts)-1]
	eff := h.history(conv, schema.ViewEffective, last.ID)
	evs := h.events(conv)
	got := eventTypes(evs, last.ID)
	want := []schema.EventType{schema.EventContextManaging, schema.EventCondenseContext}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("events of the last turn: %v (all: %v)", got, eventTypes(evs, ""))
	}
	cc := evs[len(evs)-1].(*schema.CondenseContext)
	if cc.PrevContextTokens < 3000 || cc.NewContextTokens >= cc.PrevContextTokens || cc.Trigger != schema.TriggerAuto || cc.Model != "test-model" {
		t.Fatalf("condense figures %+v", cc)
	}
	// The new figure is the effective history's count, as read back.
	if cc.NewContextTokens != tokensOf(eff) {
		t.Fatalf("new_context_tokens %d, effective history counts %d", cc.NewContextTokens, tokensOf(eff))
	}
	if cc.Cost <= 0 || !strings.HasPrefix(cc.Summary, "Summary of") {
		t.Fatalf("cost %v summary %q", cc.Cost, cc.Summary)
	}
	// first + summary + last 3
	if len(eff) != 5 || !eff[1].IsSummary || eff[1].CondenseID != cc.CondenseID || eff[4].ID != last.ID {
		t.Fatalf("effective history: %d messages, summary at 1: %v", len(eff), len(eff) > 1 && eff[1].IsSummary)
	}
	full := h.history(conv, schema.ViewFull, "")
	if len(full) != 11 {
		t.Fatalf("full history %d messages, want 10 turns + summary", len(full))
	}
	st := h.status(conv)
	if st.ContextTokens != cc.NewContextTokens || st.Condensations != 1 || st.HiddenMessages != 6 || st.AllowedTokens != 3200 || st.Threshold != 75 {
		t.Fatalf("status %+v", st)
	}
	// The summarizer saw the detailed prompt as the system message and the
	// condensed messages plus the final instruction.
	reqs := h.ai.Requests()
	if len(reqs) != 1 || reqs[0].Chat.Messages[0].Role != "system" || len(reqs[0].Chat.Messages) != 1+7+1 {
		t.Fatalf("summarizer requests: %d", len(reqs))
	}
}

func TestContextGrewFallsBackToTruncation(t *testing.T) {
	h := start(t)
	h.ai.SetHandler(func(req openaiRequest) openaitest.Reply {
		return openaitest.Reply{Text: strings.Repeat("a very long summary ", 2000)}
	})
	const conv = "grows"
	ts := h.turns(conv, 12, 200)
	last := ts[len(ts)-1]
	h.history(conv, schema.ViewEffective, last.ID)
	evs := h.events(conv)
	all := eventTypes(evs, "")
	failed, truncated := -1, -1
	for i, e := range evs {
		if f, ok := e.(*schema.CondenseFailed); ok && failed < 0 {
			if f.Error != schema.ReasonContextGrew || f.Cost <= 0 {
				t.Fatalf("condense_failed %+v", f)
			}
			failed = i
		}
		if _, ok := e.(*schema.SlidingWindowTruncation); ok && truncated < 0 {
			truncated = i
		}
	}
	if failed < 0 || truncated < failed {
		t.Fatalf("want condense_failed(context_grew) then a truncation: %v", all)
	}
	tr := evs[truncated].(*schema.SlidingWindowTruncation)
	if tr.MessagesRemoved == 0 || tr.NewContextTokens >= tr.PrevContextTokens {
		t.Fatalf("truncation %+v", tr)
	}
	// The latch: one summarizer call, then truncations only.
	if n := h.ai.Count(); n != 1 {
		t.Fatalf("summarizer called %d times", n)
	}
}

func TestLLMErrorTruncates(t *testing.T) {
	h := start(t)
	h.ai.SetHandler(func(openaiRequest) openaitest.Reply { return openaitest.Reply{Status: 500} })
	const conv = "llm-down"
	ts := h.turns(conv, 12, 200)
	last := ts[len(ts)-1]
	h.history(conv, schema.ViewEffective, last.ID)
	evs := h.events(conv)
	var reasons []schema.Reason
	truncations := 0
	for _, e := range evs {
		switch e := e.(type) {
		case *schema.CondenseFailed:
			reasons = append(reasons, e.Error)
		case *schema.SlidingWindowTruncation:
			truncations++
		}
	}
	if len(reasons) == 0 || reasons[0] != schema.ReasonLLMError || truncations == 0 {
		t.Fatalf("events %v", eventTypes(evs, ""))
	}
	if st := h.status(conv); st.ContextTokens > st.AllowedTokens {
		t.Fatalf("still over the allowed size: %+v", st)
	}
}

func TestManualOverflowAndRewind(t *testing.T) {
	h := start(t)
	const conv = "ui-driven"
	turns := h.turns(conv, 8, 200) // ~2400 tokens: under the threshold
	before := h.history(conv, schema.ViewEffective, turns[7].ID)
	if len(before) != 8 {
		t.Fatalf("before: %d", len(before))
	}
	// Manual condense: no threshold check.
	manual := h.control(conv, schema.KindCondense, schema.Input{Trigger: schema.TriggerManual})
	after := h.history(conv, schema.ViewEffective, manual)
	if len(after) != 5 || !after[1].IsSummary {
		t.Fatalf("after manual condense: %d messages", len(after))
	}
	evs := h.events(conv)
	if got := eventTypes(evs, manual); !reflect.DeepEqual(got, []schema.EventType{schema.EventContextManaging, schema.EventCondenseContext}) {
		t.Fatalf("manual: %v", got)
	}
	if cc := evs[len(evs)-1].(*schema.CondenseContext); cc.Trigger != schema.TriggerManual {
		t.Fatalf("trigger %s", cc.Trigger)
	}
	// Rewind to the turn before the condense, keeping it: the summary goes,
	// every hidden message comes back exactly.
	rw := h.control(conv, schema.KindRewind, schema.Input{TS: turns[7].TS, IncludeTarget: true})
	restored := h.history(conv, schema.ViewFull, rw)
	if !reflect.DeepEqual(restored, before) {
		t.Fatalf("rewind did not restore exactly: %d messages", len(restored))
	}
	evs = h.events(conv)
	r, ok := evs[len(evs)-1].(*schema.Rewind)
	if !ok || len(r.RemovedCondenseIDs) != 1 || r.MessagesRestored != 4 || r.MessagesRemoved != 0 {
		t.Fatalf("rewind event %+v", evs[len(evs)-1])
	}
	// Overflow: the provider says the window is exceeded; the summarizer
	// fails, so the engine truncates.
	h.ai.Enqueue(openaitest.Reply{Status: 400})
	of := h.control(conv, schema.KindOverflow, schema.Input{})
	h.history(conv, schema.ViewEffective, of)
	evs = h.events(conv)
	want := []schema.EventType{schema.EventContextManaging, schema.EventCondenseFailed, schema.EventSlidingWindowTruncation}
	if got := eventTypes(evs, of); !reflect.DeepEqual(got, want) {
		t.Fatalf("overflow: %v", got)
	}
}

func TestDuplicatesChangeNothing(t *testing.T) {
	h := start(t)
	const conv = "dups"
	t1 := h.turn(conv, schema.RoleUser, 10)
	data, _ := schema.Marshal(t1)
	subject := schema.InputSubject(conv, schema.KindTurn)
	// Inside the dedup window: JetStream drops it (same Nats-Msg-Id).
	ack, err := bus.PublishInput(context.Background(), h.js, subject, t1.ID, data)
	if err != nil || !ack.Duplicate {
		t.Fatalf("stream dedup: %+v %v", ack, err)
	}
	// "After the window": the same input under another Nats-Msg-Id reaches
	// ctxpipe, which drops it by input id.
	h.publishRaw(subject, uuid.NewString(), data)
	if _, err := h.js.Publish(context.Background(), subject, data); err != nil {
		t.Fatal(err)
	}
	t2 := h.turn(conv, schema.RoleAssistant, 10)
	full := h.history(conv, schema.ViewFull, t2.ID)
	if len(full) != 2 || full[0].ID != t1.ID || full[1].ID != t2.ID {
		t.Fatalf("history %d messages", len(full))
	}
	if evs := h.events(conv); len(evs) != 0 {
		t.Fatalf("duplicates emitted %v", eventTypes(evs, ""))
	}
}

func TestPoisonDoesNotBlockLane(t *testing.T) {
	h := start(t)
	const conv = "poison"
	good1 := h.turn(conv, schema.RoleUser, 10)
	subject := schema.InputSubject(conv, schema.KindTurn)
	bad := []struct {
		name, id string
		data     string
		reason   schema.Reason
	}{
		{"not json", uuid.NewString(), `{"id": oops`, schema.ReasonInvalidJSON},
		{"bad role", uuid.NewString(), `{"id":"%s","conversation_id":"poison","ts":5,"role":"system","content":"x"}`, schema.ReasonBadRole},
		{"unknown profile", uuid.NewString(), `{"id":"%s","conversation_id":"poison","ts":5,"role":"user","content":"x","profile_id":"nope"}`, schema.ReasonUnknownProfile},
		{"orphan tool result", uuid.NewString(), `{"id":"%s","conversation_id":"poison","ts":5,"role":"user","content":[{"type":"tool_result","tool_use_id":"call_x","content":"?"}]}`, schema.ReasonOrphanToolResult},
		{"wrong conversation", uuid.NewString(), `{"id":"%s","conversation_id":"other","ts":5,"role":"user","content":"x"}`, schema.ReasonConversationMismatch},
	}
	for _, b := range bad {
		data := b.data
		if strings.Contains(data, "%s") {
			data = fmt.Sprintf(data, b.id)
		}
		h.publishRaw(subject, b.id, []byte(data))
	}
	good2 := h.turn(conv, schema.RoleAssistant, 10)
	full := h.history(conv, schema.ViewFull, good2.ID)
	if len(full) != 2 || full[0].ID != good1.ID || full[1].ID != good2.ID {
		t.Fatalf("history %d messages", len(full))
	}
	evs := h.events(conv)
	var reasons []schema.Reason
	for _, e := range evs {
		if r, ok := e.(*schema.InputRejected); ok {
			reasons = append(reasons, r.Reason)
			if r.Subject != subject || r.Message == "" {
				t.Fatalf("rejection %+v", r)
			}
		}
	}
	var want []schema.Reason
	for _, b := range bad {
		want = append(want, b.reason)
	}
	if !reflect.DeepEqual(reasons, want) {
		t.Fatalf("reasons %v, want %v", reasons, want)
	}
	// A rejected input's payload is kept, and wait_for reports the rejection.
	status, reason, found, err := h.store.InputStatus(context.Background(), bad[1].id)
	if err != nil || !found || status != store.StatusRejected || reason != string(schema.ReasonBadRole) {
		t.Fatalf("input status %v %v %v %v", status, reason, found, err)
	}
	req, _ := json.Marshal(schema.HistoryRequest{ConversationID: conv, WaitFor: bad[1].id})
	msg, err := h.nc.Request(schema.SubjectHistory, req, 5*time.Second)
	if err != nil || !strings.Contains(string(msg.Data), string(schema.QueryInputRejected)) {
		t.Fatalf("wait_for a rejected input: %s %v", msg.Data, err)
	}
}

func TestConversationsProceedInParallelAndInOrder(t *testing.T) {
	h := start(t)
	var lasts []schema.Turn
	const convs, turns = 8, 30
	for i := 0; i < turns; i++ {
		for c := 0; c < convs; c++ {
			role := schema.RoleUser
			if i%2 == 1 {
				role = schema.RoleAssistant
			}
			t := h.turn(fmt.Sprintf("par-%d", c), role, 60)
			if i == turns-1 {
				lasts = append(lasts, t)
			}
		}
	}
	for c, last := range lasts {
		full := h.history(fmt.Sprintf("par-%d", c), schema.ViewFull, last.ID)
		var prev int64
		n := 0
		for _, m := range full {
			if m.Synthetic() {
				continue
			}
			if m.TS <= prev {
				t.Fatalf("conversation %d out of order", c)
			}
			prev = m.TS
			n++
		}
		if n != turns {
			t.Fatalf("conversation %d has %d turns", c, n)
		}
	}
	// Each committed input is counted once in every latency stage: the
	// applied ones, and any redelivery found stored already.
	applied := h.metrics.Value("ctxpipe_inputs_total", `outcome="applied"`)
	if applied != convs*turns {
		t.Fatalf("%v inputs applied, want %d", applied, convs*turns)
	}
	for _, stage := range []string{"delivery", "queued", "prepare", "commit"} {
		label := fmt.Sprintf("stage=%q", stage)
		committed := func() float64 {
			return applied + h.metrics.Value("ctxpipe_inputs_total", `outcome="duplicate"`) +
				h.metrics.Value("ctxpipe_inputs_total", `outcome="rejected"`)
		}
		deadline := time.Now().Add(5 * time.Second)
		for h.metrics.Value("ctxpipe_input_stage_seconds_count", label) != committed() && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := h.metrics.Value("ctxpipe_input_stage_seconds_count", label); n != committed() {
			t.Fatalf("stage %s counted %v inputs, %v committed", stage, n, committed())
		}
	}
	if h.metrics.Value("ctxpipe_input_stage_seconds_sum", `stage="commit"`) <= 0 {
		t.Fatal("the commit stage took no time")
	}
	// Every round appended one record per partition it touched, each timed.
	rounds, appends := h.metrics.Value("ctxpipe_commits_total", ""), h.metrics.Value("ctxpipe_changelog_append_seconds_count", "")
	if rounds == 0 || appends < rounds || h.metrics.Value("ctxpipe_changelog_append_seconds_sum", "") <= 0 {
		t.Fatalf("%v rounds, %v appends timed (sum %vs): want an append timed for each round's partitions", rounds, appends,
			h.metrics.Value("ctxpipe_changelog_append_seconds_sum", ""))
	}
}

func TestSlowCondenseKeepsInputAliveAndOthersFlowing(t *testing.T) {
	// Two workers only: a conversation waiting on its condense holds its
	// worker, and every other conversation must still be scheduled on the
	// other one.
	h := startWith(t, pipeline.Config{Lanes: 2, AckWait: 2 * time.Second, MaxDeliver: 5})
	// The summarizer takes 5 s, over twice this runner's ack wait: without
	// in-progress acks the held inputs would be redelivered.
	h.ai.SetHandler(func(req openaiRequest) openaitest.Reply {
		r := openaitest.DefaultReply(req)
		r.Delay = 5 * time.Second
		return r
	})
	ts := h.turns("slow", 10, 200)
	last := ts[len(ts)-1]
	// Other conversations, published while the condense runs, are all
	// readable before the slow one is, whatever their partition.
	for i := range 8 {
		conv := fmt.Sprintf("other-%d", i)
		var lastOther schema.Turn
		for range 3 {
			lastOther = h.turn(conv, schema.RoleUser, 10)
		}
		h.history(conv, schema.ViewFull, lastOther.ID)
	}
	if _, _, found, err := h.store.InputStatusIn(context.Background(), "slow", last.ID); err != nil || found {
		t.Fatalf("the other conversations should be readable while the condense still runs (found=%v, %v)", found, err)
	}
	eff := h.history("slow", schema.ViewEffective, last.ID)
	if len(eff) != 5 || !eff[1].IsSummary {
		t.Fatalf("slow condense did not apply: %d messages", len(eff))
	}
	if n := h.metrics.Value("ctxpipe_redeliveries_total", ""); n != 0 {
		t.Fatalf("%v redeliveries: in-progress acks did not keep the inputs alive", n)
	}
}

func TestHeldBytesBoundDoesNotStall(t *testing.T) {
	// Room for about two turns at a time: the dispatcher waits for lanes to
	// ack before fetching more, and everything still lands, in order.
	h := startWith(t, pipeline.Config{Lanes: 4, AckWait: 5 * time.Second, MaxHeldBytes: 3000})
	var lasts []schema.Turn
	for c := 0; c < 4; c++ {
		ts := h.turns(fmt.Sprintf("tight-%d", c), 10, 150)
		lasts = append(lasts, ts[len(ts)-1])
	}
	for _, last := range lasts {
		if full := h.history(last.ConversationID, schema.ViewFull, last.ID); len(full) != 10 {
			t.Fatalf("%s: %d messages", last.ConversationID, len(full))
		}
	}
	// Acks follow the commit that made the history readable.
	for deadline := time.Now().Add(5 * time.Second); h.runner.Held() != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d inputs still held", h.runner.Held())
		}
	}
}

// An event leaves as soon as the commit that stored it is done: the
// harness's relay never polls, and nobody flushes it here, so only the
// commit's wake-up can send the condense's events.
func TestEventsLeaveWithTheirCommit(t *testing.T) {
	h := start(t)
	const conv = "wake"
	sub, err := h.nc.SubscribeSync("ctx.events." + conv + ".>")
	if err != nil {
		t.Fatal(err)
	}
	ts := h.turns(conv, 6, 50)
	h.history(conv, schema.ViewEffective, ts[5].ID) // turns alone store no event
	id := h.control(conv, schema.KindCondense, schema.Input{Trigger: schema.TriggerManual})
	h.history(conv, schema.ViewEffective, id)
	for {
		msg, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("no condense event reached ctx.events.%s.> after its commit: %v", conv, err)
		}
		if strings.HasSuffix(msg.Subject, ".condense_context") {
			return
		}
	}
}

// A model that answers with white space only is reported as empty_summary,
// with the cost of the reply it was paid for: the summarizer's error must
// not turn it into an llm_error costing nothing (conformance run, D1).
func TestEmptySummaryKeepsItsReasonAndCost(t *testing.T) {
	h := start(t)
	h.ai.SetHandler(func(openaiRequest) openaitest.Reply {
		return openaitest.Reply{Text: "  \n ", PromptTokens: 200_000, CompletionTokens: 10, FinishReason: "length"}
	})
	const conv = "blank-model"
	ts := h.turns(conv, 12, 200)
	h.history(conv, schema.ViewEffective, ts[len(ts)-1].ID)
	var failed *schema.CondenseFailed
	for _, e := range h.events(conv) {
		if f, ok := e.(*schema.CondenseFailed); ok && failed == nil {
			failed = f
		}
	}
	if failed == nil {
		t.Fatalf("no condense_failed: %v", eventTypes(h.events(conv), ""))
	}
	// smallProfile's prices: $1 per million input tokens.
	if failed.Error != schema.ReasonEmptySummary || failed.Cost < 0.2 {
		t.Fatalf("condense_failed %q costing %v, want empty_summary costing about 0.2: %s", failed.Error, failed.Cost, failed.Message)
	}
}
