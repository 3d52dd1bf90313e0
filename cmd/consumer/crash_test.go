package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	openai "github.com/sashabaranov/go-openai"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/condense"
	"github.com/ctxpipe/ctxpipe/internal/natstest"
	"github.com/ctxpipe/ctxpipe/internal/openaitest"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/store"
)

// The binary is built once per test process (go test -count=3 reuses it);
// TestMain removes it.
var (
	buildOnce sync.Once
	buildDir  string
	buildBin  string
	buildErr  error
)

// buildConsumer builds this package's binary (without -race: the child is
// the system under test, the race detector watches the test process).
func buildConsumer(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		// The go on PATH, else the one in $GOROOT (the go command sets it
		// for tests it runs).
		goTool, err := exec.LookPath("go")
		if err != nil {
			goTool = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
		}
		if buildDir, buildErr = os.MkdirTemp("", "ctxpipe-consumer-test-"); buildErr != nil {
			return
		}
		buildBin = filepath.Join(buildDir, "consumer")
		cmd := exec.Command(goTool, "build", "-o", buildBin, ".")
		cmd.Dir = "."
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildBin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// proc is the consumer running as a child process.
type proc struct {
	cmd  *exec.Cmd
	log  string
	done chan error // receives Wait's result once
	err  error
	exit bool
}

// childEnv is the test's environment without the variables that would
// change which server or LLM the child uses.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "NATS_") || strings.HasPrefix(k, "CTXPIPE_") || strings.HasPrefix(k, "OPENAI_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

func startConsumer(t *testing.T, bin, logPath string, env []string, args ...string) *proc {
	t.Helper()
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(childEnv(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start consumer: %v", err)
	}
	p := &proc{cmd: cmd, log: logPath, done: make(chan error, 1)}
	go func() {
		err := cmd.Wait()
		f.Close()
		p.done <- err
	}()
	t.Cleanup(func() {
		if !p.exit {
			_ = cmd.Process.Kill()
			p.wait()
		}
		if t.Failed() {
			t.Logf("%s:\n%s", filepath.Base(logPath), notable(logPath))
		}
	})
	return p
}

// notable returns the last 60 lines of a child's log that are not routine
// (every condense is logged at info).
func notable(path string) string {
	b, _ := os.ReadFile(path)
	var keep []string
	for _, line := range strings.Split(string(b), "\n") {
		if line != "" && !strings.Contains(line, "msg=condensed ") {
			keep = append(keep, line)
		}
	}
	return strings.Join(keep[max(0, len(keep)-60):], "\n")
}

// wait returns the child's exit error once it has exited.
func (p *proc) wait() error {
	if !p.exit {
		p.err, p.exit = <-p.done, true
	}
	return p.err
}

// waitReady polls ctx.q.status until the child's responder answers; a
// not_found reply for a conversation nobody wrote proves it is up.
func waitReady(t *testing.T, c *client, p *proc, deadline time.Time) {
	t.Helper()
	for {
		_, err := c.status("readiness-probe")
		if isQueryCode(err, schema.QueryNotFound) {
			return
		}
		select {
		case err := <-p.done:
			p.err, p.exit = err, true
			t.Fatalf("consumer exited before it was ready: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("consumer not ready: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// crashWorkload is 15 conversations of 100 turns each, user and assistant
// alternating, every tenth pair a tool_use and its tool_result, published
// round-robin so every conversation is in flight at once.
func crashWorkload(profile string) (order []schema.Turn, byConv map[string][]schema.Turn) {
	const convs, perConv = 15, 100
	rng := rand.New(rand.NewPCG(7, 11))
	byConv = map[string][]schema.Turn{}
	ts := int64(1_700_000_000_000)
	for i := 0; i < perConv; i++ {
		for c := 0; c < convs; c++ {
			conv := fmt.Sprintf("crash-%02d", c)
			ts++
			tn := textTurn(rng, conv, profile, i, ts, 120+rng.IntN(160))
			switch i % 10 {
			case 5: // assistant calls a tool
				tn.Content = schema.BlockContent(
					schema.Block{Type: schema.BlockText, Text: tn.Content.Text},
					schema.Block{Type: schema.BlockToolUse, ID: fmt.Sprintf("call_%d_%d", c, i), Name: "read_file",
						Input: json.RawMessage(fmt.Sprintf(`{"path":"src/module_%d.go"}`, i))})
			case 6: // the user's turn carries its result
				res := schema.TextContent(sentenceText(rng, 150))
				tn.Content = schema.BlockContent(schema.Block{Type: schema.BlockToolResult, ToolUseID: fmt.Sprintf("call_%d_%d", c, i-1), Content: &res})
			}
			byConv[conv] = append(byConv[conv], tn)
			order = append(order, tn)
		}
	}
	return order, byConv
}

// publishAll publishes every turn asynchronously and reports the first
// failure (nil when every PubAck came back) on the returned channel.
func publishAll(js jetstream.JetStream, turns []schema.Turn) <-chan error {
	out := make(chan error, 1)
	go func() {
		futures := make([]jetstream.PubAckFuture, 0, len(turns))
		for _, tn := range turns {
			data, err := schema.Marshal(tn)
			if err != nil {
				out <- err
				return
			}
			f, err := js.PublishAsync(schema.InputSubject(tn.ConversationID, schema.KindTurn), data,
				jetstream.WithMsgID(tn.ID), jetstream.WithExpectStream(bus.StreamIn))
			if err != nil {
				out <- fmt.Errorf("publish %s: %w", tn.ID, err)
				return
			}
			futures = append(futures, f)
		}
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				out <- fmt.Errorf("publish %s: %w", f.Msg().Header.Get(jetstream.MsgIDHeader), err)
				return
			case <-time.After(30 * time.Second):
				out <- fmt.Errorf("no PubAck for %s", f.Msg().Header.Get(jetstream.MsgIDHeader))
				return
			}
		}
		out <- nil
	}()
	return out
}

// appliedCount opens the SQLite file (no consumer running) and counts the
// published inputs it has applied; anything else stored fails the test.
func appliedCount(t *testing.T, dbPath string, turns []schema.Turn) int {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, dbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	n := 0
	for _, tn := range turns {
		status, reason, found, err := st.InputStatus(ctx, tn.ID)
		switch {
		case err != nil:
			t.Fatal(err)
		case !found:
		case status != store.StatusApplied:
			t.Fatalf("input %s is %s (%s)", tn.ID, status, reason)
		default:
			n++
		}
	}
	return n
}

// metricValue reads one sample from a Prometheus text scrape (0 when absent).
func metricValue(t *testing.T, scrape, series string) float64 {
	t.Helper()
	for _, line := range strings.Split(scrape, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric %s: %v", line, err)
			}
			return f
		}
	}
	return 0
}

// crashRig is one JetStream server owned by the test, so the streams and
// the durable consumer outlive the service, and a data dir the service
// processes share, one after another.
type crashRig struct {
	t        *testing.T
	ctx      context.Context
	deadline time.Time
	bin      string
	c        *client
	dir      string
	dbPath   string
	args     []string
	env      []string // added to the child's environment
	runs     int
}

// crashProfile condenses often: threshold 50 % of a 6000-token window, and
// turns of a few hundred tokens, so about every tenth turn condenses.
const crashProfile = "crash"

func newCrashRig(t *testing.T, ackWait time.Duration) *crashRig {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the service binary")
	}
	deadline := time.Now().Add(2 * time.Minute)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	t.Cleanup(cancel)
	r := &crashRig{t: t, ctx: ctx, deadline: deadline, bin: buildConsumer(t), dir: t.TempDir()}
	_, url := natstest.Run(t)
	r.c = connect(t, url)
	if err := bus.EnsureStreams(ctx, r.c.js); err != nil {
		t.Fatal(err)
	}
	dataDir := filepath.Join(r.dir, "data")
	r.dbPath = filepath.Join(dataDir, "ctxpipe.db")
	profiles := filepath.Join(r.dir, "profiles.json")
	if err := os.WriteFile(profiles, []byte(`[{"id":"crash","context_window":6000,"max_tokens":600,
		"condense_threshold":50,"strategy":"keep_tail"}]`), 0o644); err != nil {
		t.Fatal(err)
	}
	r.args = []string{"--nats-url", url, "--data-dir", dataDir, "--profiles", profiles, "--lanes", "8",
		"--ack-wait", ackWait.String(), "--log-level", "info"}
	return r
}

// slowSummarizer has the service condense through an OpenAI-compatible
// server that takes d per summary: the service is still working through
// its inputs when a test kills it, so it holds inputs it has not applied
// (on the offline condenser it had often finished them all, and a crash
// test proved nothing).
func (r *crashRig) slowSummarizer(d time.Duration) {
	ai := openaitest.New(r.t)
	ai.SetHandler(func(req openai.ChatCompletionRequest) openaitest.Reply {
		rep := openaitest.DefaultReply(req)
		rep.Delay = d
		return rep
	})
	r.env = []string{condense.EnvBaseURL + "=" + ai.URL(), condense.EnvModel + "=slow-test-model"}
}

// start runs the service binary and waits until it answers queries.
// httpAddr "" disables /metrics.
func (r *crashRig) start(httpAddr string) *proc {
	r.t.Helper()
	r.runs++
	p := startConsumer(r.t, r.bin, filepath.Join(r.dir, fmt.Sprintf("consumer-%d.log", r.runs)), r.env, append(r.args, "--http", httpAddr)...)
	waitReady(r.t, r.c, p, r.deadline)
	return p
}

// waitApplied waits until turn tn is readable.
func (r *crashRig) waitApplied(tn schema.Turn) {
	r.t.Helper()
	if _, err := r.c.history(tn.ConversationID, schema.ViewFull, tn.ID, min(time.Until(r.deadline), schema.MaxQueryTimeout)); err != nil {
		r.t.Fatalf("wait for input %s of %s: %v", tn.ID, tn.ConversationID, err)
	}
}

// resend publishes copies of turns under new Nats-Msg-Ids, as a client
// retrying after the duplicate window would: the stream keeps them, and only
// the service's check by input id can drop them.
func (r *crashRig) resend(turns []schema.Turn) {
	r.t.Helper()
	for _, tn := range turns {
		data, err := schema.Marshal(tn)
		if err != nil {
			r.t.Fatal(err)
		}
		subject := schema.InputSubject(tn.ConversationID, schema.KindTurn)
		if _, err := bus.PublishInput(r.ctx, r.c.js, subject, uuid.NewString(), data); err != nil {
			r.t.Fatal(err)
		}
	}
}

// kill sends SIGKILL and returns the durable consumer's state right after.
func (r *crashRig) kill(p *proc) *jetstream.ConsumerInfo {
	r.t.Helper()
	if err := p.cmd.Process.Kill(); err != nil {
		r.t.Fatal(err)
	}
	if err := p.wait(); err == nil {
		r.t.Fatal("the killed consumer exited cleanly")
	}
	return r.consumerInfo()
}

func (r *crashRig) consumerInfo() *jetstream.ConsumerInfo {
	r.t.Helper()
	return consumersInfo(r.ctx, r.t, r.c.js)
}

// consumersInfo sums the state of every partition's durable consumer (ack
// floors and delivered positions are the highest of any): what one consumer
// said before partitions.
func consumersInfo(ctx context.Context, t *testing.T, js jetstream.JetStream) *jetstream.ConsumerInfo {
	t.Helper()
	sum := &jetstream.ConsumerInfo{}
	stream, err := js.Stream(ctx, bus.StreamIn)
	if err != nil {
		t.Fatal(err)
	}
	lister := stream.ListConsumers(ctx)
	n := 0
	for info := range lister.Info() {
		if info.Config.Durable == "" {
			continue // an ordered consumer of a replay or a follower
		}
		n++
		sum.NumPending += info.NumPending
		sum.NumAckPending += info.NumAckPending
		sum.NumRedelivered += info.NumRedelivered
		sum.Delivered.Stream = max(sum.Delivered.Stream, info.Delivered.Stream)
		sum.AckFloor.Stream = max(sum.AckFloor.Stream, info.AckFloor.Stream)
	}
	if err := lister.Err(); err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("no consumer on " + bus.StreamIn)
	}
	return sum
}

// drain waits for the last turn of every conversation, then until the
// durable consumer has nothing pending or unacked (re-sent copies included).
func (r *crashRig) drain(byConv map[string][]schema.Turn) {
	r.t.Helper()
	for _, turns := range byConv {
		r.waitApplied(turns[len(turns)-1])
	}
	for {
		info := r.consumerInfo()
		if info.NumPending == 0 && info.NumAckPending == 0 {
			return
		}
		if time.Now().After(r.deadline) {
			r.t.Fatalf("consumer not drained: %d pending, %d unacked", info.NumPending, info.NumAckPending)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop stops the service gracefully (SIGINT), which flushes the outbox.
func (r *crashRig) stop(p *proc) {
	r.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		r.t.Fatal(err)
	}
	if err := p.wait(); err != nil {
		r.t.Fatalf("graceful stop: %v", err)
	}
}

// crashFigures is what verify counted.
type crashFigures struct {
	events, condenses, truncations int
}

// verify checks, with no service running, that SQLite holds every
// published turn exactly once and in publish order, every input applied,
// no other conversation, and that CTX_EVENTS holds exactly the events
// SQLite has, each once, with its id as Nats-Msg-Id, each conversation's
// decisions in commit order (verifyStored).
func (r *crashRig) verify(order []schema.Turn, byConv map[string][]schema.Turn) crashFigures {
	r.t.Helper()
	return verifyStored(r.ctx, r.t, r.dbPath, order, byConv, readEvents(r.t, r.c.js, bus.EventSubjects), true)
}

// verifyStored checks that the SQLite file at dbPath (no consumer running)
// holds every published turn of byConv's conversations exactly once and in
// publish order, every input of order applied, and exactly their events on
// the stream (onStream, theirs only), each once there, with its id as
// Nats-Msg-Id, each conversation's decisions in commit order. With only,
// the file holds no other conversation; without, it may (an instance keeps
// the history of partitions it held for a while, which is not checked).
func verifyStored(ctx context.Context, t *testing.T, dbPath string, order []schema.Turn, byConv map[string][]schema.Turn, onStream []streamEvent, only bool) crashFigures {
	t.Helper()
	if n := appliedCount(t, dbPath, order); n != len(order) {
		t.Fatalf("%d of %d inputs applied", n, len(order))
	}
	st, err := store.Open(ctx, dbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	convs, err := st.Conversations(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for key := range byConv {
		if !slices.Contains(convs, key) {
			t.Fatalf("%s not stored; stored: %v", key, convs)
		}
	}
	if only && len(convs) != len(byConv) {
		t.Fatalf("%d conversations stored, want %d: %v", len(convs), len(byConv), convs)
	}
	var fig crashFigures
	dbEvents := map[string]bool{}
	dbOrder := map[string][]string{} // per conversation, without context_managing
	for conv, turns := range byConv {
		msgs, err := st.Messages(ctx, conv)
		if err != nil {
			t.Fatal(err)
		}
		pos := map[string]int{}
		for i, tn := range turns {
			pos[fmt.Sprintf("%s@%d", tn.ID, tn.TS)] = i
		}
		var got []int // publish positions of the stored turns, in stored order
		for _, m := range msgs {
			if m.Synthetic() {
				continue
			}
			i, ok := pos[fmt.Sprintf("%s@%d", m.ID, m.TS)]
			if !ok {
				t.Fatalf("%s: stored message %s@%d was never published", conv, m.ID, m.TS)
			}
			got = append(got, i)
		}
		if len(got) != len(turns) || !slices.IsSorted(got) || !uniqueInts(got) {
			t.Fatalf("%s: stored turns, by publish position, are %v; want 0..%d each once in order", conv, got, len(turns)-1)
		}
		evs, err := st.Events(ctx, conv)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			h := e.Header()
			if dbEvents[h.ID] {
				t.Fatalf("event %s stored twice", h.ID)
			}
			dbEvents[h.ID] = true
			switch h.Type {
			case schema.EventContextManaging:
				continue
			case schema.EventCondenseContext:
				fig.condenses++
			case schema.EventSlidingWindowTruncation:
				fig.truncations++
			case schema.EventInputRejected:
				t.Fatalf("input rejected: %+v", e)
			}
			dbOrder[conv] = append(dbOrder[conv], h.ID)
		}
	}
	if fig.condenses == 0 {
		t.Fatal("no condense_context event: the test did not exercise condensing")
	}
	seen := map[string]bool{}
	streamOrder := map[string][]string{}
	for _, se := range onStream {
		h := se.ev.Header()
		if se.msgID != h.ID {
			t.Fatalf("Nats-Msg-Id %q on event %s", se.msgID, h.ID)
		}
		if seen[h.ID] {
			t.Fatalf("event %s (%s) appears twice on %s", h.ID, h.Type, bus.StreamEvents)
		}
		seen[h.ID] = true
		if !dbEvents[h.ID] {
			t.Fatalf("event %s (%s) is on the stream but not in SQLite", h.ID, h.Type)
		}
		// context_managing is also published directly when a condense
		// starts, so it may come before earlier decisions' outbox rows.
		if h.Type != schema.EventContextManaging {
			streamOrder[h.ConversationID] = append(streamOrder[h.ConversationID], h.ID)
		}
	}
	if len(seen) != len(dbEvents) {
		t.Fatalf("%d events on the stream, %d in SQLite", len(seen), len(dbEvents))
	}
	for conv, want := range dbOrder {
		if !reflect.DeepEqual(streamOrder[conv], want) {
			t.Fatalf("%s: events on the stream in another order than committed", conv)
		}
	}
	fig.events = len(onStream)
	return fig
}

func uniqueInts(s []int) bool {
	for i := 1; i < len(s); i++ {
		if s[i] == s[i-1] {
			return false
		}
	}
	return true
}

// TestCrashKillRestartAppliesEveryInputOnce kills the consumer with SIGKILL
// while inputs are in flight, restarts it on the same SQLite file and
// JetStream server, and checks that every published input is stored exactly
// once and in order, and every event is on CTX_EVENTS exactly once.
//
// The turns are all in CTX_IN before the service starts, so it fetches them
// at once and holds most of them when it is killed.
// TestRestartKeepsOrderWhenNewInputsArrive covers inputs that arrive while
// it is down.
func TestCrashKillRestartAppliesEveryInputOnce(t *testing.T) {
	r := newCrashRig(t, 6*time.Second)
	r.slowSummarizer(50 * time.Millisecond)
	order, byConv := crashWorkload(crashProfile)
	if err := <-publishAll(r.c.js, order); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	p1 := r.start("")
	// Kill once a tenth of the inputs is readable: most of the rest are in
	// flight, fetched and held in the lanes.
	r.waitApplied(order[len(order)/10])
	atKill := r.kill(p1)
	applied := appliedCount(t, r.dbPath, order)
	t.Logf("killed %v after the start: %d of %d inputs applied; %d delivered and unacked, %d never delivered",
		time.Since(began).Round(time.Millisecond), applied, len(order), atKill.NumAckPending, atKill.NumPending)
	if applied >= len(order) || atKill.NumAckPending == 0 {
		t.Fatalf("nothing was in flight at the kill: %d applied, %d unacked", applied, atKill.NumAckPending)
	}

	// Re-send a slice around the kill point: ctxpipe must drop every copy.
	k := len(order) / 5
	resent := order[k-50 : k+100]
	r.resend(resent)
	httpAddr := freeAddr(t)
	p2 := r.start(httpAddr)
	r.drain(byConv)
	code, scrape := httpGet(t, "http://"+httpAddr+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	// Inputs the killed process appended to the changelog but had not
	// committed come back through the follower, counted apart.
	applied2 := metricValue(t, scrape, `ctxpipe_inputs_total{outcome="applied"}`) + metricValue(t, scrape, "ctxpipe_changelog_changes_total")
	dups := metricValue(t, scrape, `ctxpipe_inputs_total{outcome="duplicate"}`)
	redelivered := metricValue(t, scrape, "ctxpipe_redeliveries_total")
	rejected := metricValue(t, scrape, `ctxpipe_inputs_total{outcome="rejected"}`)
	// The held inputs come back as redeliveries, or as first deliveries if
	// the runner recreates its consumer from the ack floor; either way the
	// restart applies exactly those the killed process had not.
	t.Logf("after the restart: %v applied, %v duplicates dropped (%d re-sent), %v redeliveries", applied2, dups, len(resent), redelivered)
	if int(applied2) != len(order)-applied || rejected != 0 || int(dups) < len(resent) {
		t.Fatalf("restart applied %v (want %d), rejected %v, dropped %v duplicates (want at least %d)",
			applied2, len(order)-applied, rejected, dups, len(resent))
	}
	r.stop(p2)
	fig := r.verify(order, byConv)
	t.Logf("%d inputs stored once each, in order; %d events exactly once (%d condense_context, %d sliding_window_truncation)",
		len(order), fig.events, fig.condenses, fig.truncations)
}

// TestRestartKeepsOrderWhenNewInputsArrive kills the consumer while it holds
// inputs, publishes more turns to the same conversations while it is down
// (new turns and re-sent copies of held ones), and restarts it. JetStream
// delivers new messages at once but redelivers held ones only when their ack
// wait expires, so the service must resume in stream order (the runner
// recreates its consumer after the ack floor) for each conversation's turns
// to be applied in order; otherwise later turns overtake earlier ones and a
// tool_result whose tool_use is not yet applied is rejected.
func TestRestartKeepsOrderWhenNewInputsArrive(t *testing.T) {
	r := newCrashRig(t, 3*time.Second)
	r.slowSummarizer(100 * time.Millisecond)
	p1 := r.start("")
	order, byConv := crashWorkload(crashProfile)
	// Phase one: the first 60 turns of each conversation.
	split := 60 * len(byConv)
	// The kill comes while phase one is still being published and applied:
	// the service must hold inputs it has not applied yet.
	published := publishAll(r.c.js, order[:split])
	r.waitApplied(order[split/15])
	atKill := r.kill(p1)
	if err := <-published; err != nil {
		t.Fatal(err)
	}
	applied := appliedCount(t, r.dbPath, order)
	t.Logf("at the kill: %d of %d inputs applied, %d held by the killed process", applied, split, atKill.NumAckPending)
	if atKill.NumAckPending == 0 || applied >= split {
		t.Fatalf("nothing was held at the kill (%d applied, %d unacked)", applied, atKill.NumAckPending)
	}
	// Phase two, while the service is down, and copies of phase one's turns
	// around the kill point under new Nats-Msg-Ids (a client retrying).
	if err := <-publishAll(r.c.js, order[split:]); err != nil {
		t.Fatal(err)
	}
	r.resend(order[split/15 : split/15+90])
	p2 := r.start("")
	r.drain(byConv)
	r.stop(p2)
	fig := r.verify(order, byConv)
	t.Logf("%d inputs stored once each, in order; %d events exactly once", len(order), fig.events)
}
