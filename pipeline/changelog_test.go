package pipeline_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/sashabaranov/go-openai"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/changelog"
	"github.com/ctxpipe/ctxpipe/internal/openaitest"
	"github.com/ctxpipe/ctxpipe/internal/transcripts"
	"github.com/ctxpipe/ctxpipe/pipeline"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/store"
)

// A database rebuilt from CTX_STATE alone is byte-identical to the one the
// service wrote, message by message and tag by tag: real agent
// runs under tenants and without, condenses and truncations through the
// summarizer, a manual condense, a rewind, rejected inputs, and records cut
// into pieces.
func TestRebuildIsByteIdentical(t *testing.T) {
	h := startWith(t, pipeline.Config{Lanes: 4, AckWait: 5 * time.Second, MaxDeliver: 5, RetryBudget: time.Second,
		MaxLogPiece: 16 << 10})
	files := transcripts.Files(t, "../../shared/data/transcripts")
	var last []struct{ conv, id string }
	for i, f := range files[:4] {
		// The payload names the conversation as its tenant's agent does;
		// the subject carries the tenant (the service keys it acme.runN).
		conv, key := fmt.Sprintf("run%d", i), fmt.Sprintf("acme.run%d", i)
		if i == 3 {
			conv, key = "plain-run", "plain-run" // no tenant: the shared partition
		}
		lines := transcripts.Read(t, f)
		var id string
		for k, l := range lines[:min(len(lines), 80)] {
			tn := l.Turn
			tn.ConversationID, tn.ProfileID, tn.TS = conv, "", h.nextTS()
			h.publish(schema.InputSubject(key, schema.KindTurn), tn.ID, tn)
			id = tn.ID
			if k == 40 {
				tenantControl(h, key, conv, schema.KindCondense, schema.Input{Trigger: schema.TriggerManual})
			}
		}
		last = append(last, struct{ conv, id string }{key, id})
	}
	h.publishRaw(schema.InputSubject("acme.bad", schema.KindTurn), "bad-1", []byte(`{"id": nope`))
	ctx := context.Background()
	applied := func(conv string, ids ...string) func() bool {
		tenant, _ := schema.SplitKey(conv)
		return func() bool {
			seen, err := h.store.SeenInputs(ctx, tenant, ids)
			return err == nil && len(seen) == len(ids)
		}
	}
	for _, l := range last {
		waitFor(t, applied(l.conv, l.id))
	}
	// plain-run was truncated many times: rewind it to its middle.
	msgs, err := h.store.Messages(ctx, "plain-run")
	if err != nil {
		t.Fatal(err)
	}
	rw := h.control("plain-run", schema.KindRewind, schema.Input{TS: msgs[len(msgs)/2].TS})
	waitFor(t, applied("plain-run", rw))

	// The rejection of the bad input has no id of its own to wait for.
	waitFor(t, func() bool {
		evs, err := h.store.Events(ctx, "acme.bad")
		return err == nil && len(evs) == 1
	})
	pos, _, err := h.store.LogPositions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pieces, records := countState(t, h.js)
	if pieces == 0 || records == 0 {
		t.Fatalf("%d pieces, %d records: the test did not cut a record", pieces, records)
	}
	rebuilt, err := store.Open(ctx, filepath.Join(t.TempDir(), "rebuilt.db"))
	if err != nil {
		t.Fatal(err)
	}
	stats, err := changelog.Rebuild(ctx, h.js, rebuilt, changelog.RebuildOptions{UpTo: pos})
	if err != nil {
		t.Fatal(err)
	}
	rebuilt.Close()
	t.Logf("replayed %d messages (%d pieces), %d records, %d changes in %v", stats.Messages, pieces, stats.Records, stats.Entries, stats.Took)
	report, err := store.Diff(ctx, h.store.Path(), filepath.Join(filepath.Dir(rebuilt.Path()), "rebuilt.db"))
	if err != nil {
		t.Fatal(err)
	}
	if !report.Identical() {
		t.Fatalf("rebuilt database differs:\n%s", report)
	}
	var condensed bool
	evs, err := h.store.Events(ctx, "acme.run1")
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		condensed = condensed || ev.Header().Type == schema.EventCondenseContext
	}
	evs, err = h.store.Events(ctx, "plain-run")
	if err != nil {
		t.Fatal(err)
	}
	var rewound bool
	for _, ev := range evs {
		rewound = rewound || ev.Header().Type == schema.EventRewind
	}
	if !condensed || !rewound {
		t.Fatalf("condensed %v, rewound %v: the test did not exercise summaries and rewinds", condensed, rewound)
	}
}

// tenantControl publishes a control input of conversation conv as its
// tenant's client would (the payload without the tenant), on key's subject.
func tenantControl(h *harness, key, conv string, kind schema.InputKind, in schema.Input) string {
	h.t.Helper()
	in.ID, in.ConversationID, in.TS = uuid.NewString(), conv, h.nextTS()
	data, err := schema.ControlPayload(in)
	if err != nil {
		h.t.Fatal(err)
	}
	h.publishRaw(schema.InputSubject(key, kind), in.ID, data)
	return in.ID
}

// countState counts CTX_STATE's messages that are pieces of a record and
// those that complete one.
func countState(t *testing.T, js jetstream.JetStream) (pieces, records int) {
	t.Helper()
	ctx := context.Background()
	s, err := js.Stream(ctx, bus.StreamState)
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= s.CachedInfo().State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		if m.Header.Get(changelog.PieceHeader) != "" {
			pieces++
		} else {
			records++
		}
	}
	return pieces, records
}

func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
	}
}

// A batch prepared while the follower applied another writer's record of
// its partition (a takeover before the follower caught up) is prepared
// again: the append's fence alone would pass, since the store applied that
// record and the fence moved with it, and the batch's decisions (what to
// condense or truncate, which tool call a result answers) would have been
// taken on a state without the record.
// Here the worker is held inside a condense (the summarizer waits) while a
// record of another writer adds a turn to the same conversation.
func TestStaleViewIsPreparedAgain(t *testing.T) {
	h := start(t)
	asked, release := make(chan struct{}, 1), make(chan struct{})
	h.ai.SetHandler(func(req openai.ChatCompletionRequest) openaitest.Reply {
		select {
		case asked <- struct{}{}:
			<-release
		default:
		}
		return openaitest.DefaultReply(req)
	})
	const conv = "stale"
	turns := h.turns(conv, 12, 400)
	select {
	case <-asked:
	case <-time.After(20 * time.Second):
		t.Fatal("the conversation never asked its summarizer")
	}
	ctx := context.Background()
	st, _, err := h.store.State(ctx, conv)
	if err != nil {
		t.Fatal(err)
	}
	// Another writer's record for the shared partition, after its last
	// message: one more turn of the conversation, with the state it leads to.
	p := h.runner.Partitions()
	var fence uint64
	s, err := h.js.Stream(ctx, bus.StreamState)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := s.GetLastMsgForSubject(ctx, bus.StateSubject(p)); err == nil {
		fence = m.Sequence
	}
	tn := schema.Turn{ID: uuid.NewString(), ConversationID: conv, TS: st.LastTS + 1, Role: schema.RoleUser,
		Content: schema.TextContent("from the other writer")}
	payload, err := schema.Marshal(tn)
	if err != nil {
		t.Fatal(err)
	}
	st.Messages++
	st.ContextTokens += 7
	st.LastTS = tn.TS
	rec, err := changelog.Encode(changelog.Record{Partition: p, At: time.Now().UnixMilli(), Entries: []store.Entry{{
		Input: store.InputRecord{ID: tn.ID, ConversationID: conv, Kind: string(schema.KindTurn),
			Subject: schema.InputSubject(conv, schema.KindTurn), TS: tn.TS, Payload: payload, Status: store.StatusApplied},
		Changes: &schema.Changes{Insert: []schema.Insertion{{Message: schema.Message{Turn: tn, Tokens: 7}}}, State: st},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (&changelog.Log{JS: h.js}).Append(ctx, p, fence, rec); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		seen, err := h.store.SeenInputs(ctx, "", []string{tn.ID})
		return err == nil && len(seen) == 1
	})
	close(release)
	h.history(conv, schema.ViewFull, turns[len(turns)-1].ID)

	st, _, err = h.store.State(ctx, conv)
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := h.store.Messages(ctx, conv)
	if err != nil {
		t.Fatal(err)
	}
	// The state agrees with the store either way (the condense reads the
	// stored history); what the fence alone let through is the decision
	// taken on a view without the other writer's turn.
	eff := 0
	for _, m := range h.history(conv, schema.ViewEffective, "") {
		eff += m.Tokens
	}
	if st.Messages != len(msgs) || st.ContextTokens != eff+st.SystemTokens {
		t.Fatalf("the state counts %d messages and %d tokens, the store holds %d messages of %d effective tokens",
			st.Messages, st.ContextTokens, len(msgs), eff+st.SystemTokens)
	}
	if h.metrics.Value("ctxpipe_changelog_fenced_total", "") == 0 {
		t.Fatal("the stale batch was not prepared again")
	}
}

// A record the store refuses (here a tag on a message that does not exist)
// is skipped alike by the running instance's follower and by a rebuild, so
// the rebuilt file is still the running one; the partition goes on.
func TestRefusedRecordIsSkippedAlike(t *testing.T) {
	h := start(t)
	ctx := context.Background()
	const conv = "refused"
	h.turns(conv, 3, 20)
	first := h.turns(conv, 1, 20)[0]
	h.history(conv, schema.ViewFull, first.ID)

	p := h.runner.Partitions()
	s, err := h.js.Stream(ctx, bus.StreamState)
	if err != nil {
		t.Fatal(err)
	}
	last, err := s.GetLastMsgForSubject(ctx, bus.StateSubject(p))
	if err != nil {
		t.Fatal(err)
	}
	tn := schema.Turn{ID: uuid.NewString(), ConversationID: conv, TS: h.nextTS(), Role: schema.RoleUser, Content: schema.TextContent("x")}
	payload, err := schema.Marshal(tn)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := changelog.Encode(changelog.Record{Partition: p, At: time.Now().UnixMilli(), Entries: []store.Entry{{
		Input: store.InputRecord{ID: tn.ID, ConversationID: conv, Kind: string(schema.KindTurn),
			Subject: schema.InputSubject(conv, schema.KindTurn), TS: tn.TS, Payload: payload, Status: store.StatusApplied},
		Changes: &schema.Changes{Tags: []schema.TagChange{{MessageID: "no-such-message", Field: schema.TagCondenseParent, Value: "x"}}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (&changelog.Log{JS: h.js}).Append(ctx, p, last.Sequence, rec); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return h.metrics.Value("ctxpipe_changelog_unreadable_total", "") >= 1 })
	after := h.turns(conv, 2, 20)
	h.history(conv, schema.ViewFull, after[1].ID)
	if seen, err := h.store.SeenInputs(ctx, "", []string{tn.ID}); err != nil || len(seen) != 0 {
		t.Fatalf("the refused record's input is stored (%v, %v)", seen, err)
	}

	pos, _, err := h.store.LogPositions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	rebuilt, err := store.Open(ctx, filepath.Join(dir, "rebuilt.db"))
	if err != nil {
		t.Fatal(err)
	}
	stats, err := changelog.Rebuild(ctx, h.js, rebuilt, changelog.RebuildOptions{UpTo: pos})
	rebuilt.Close()
	if err != nil {
		t.Fatal(err)
	}
	if stats.Skipped != 1 {
		t.Fatalf("the rebuild skipped %d records, want 1", stats.Skipped)
	}
	report, err := store.Diff(ctx, h.store.Path(), filepath.Join(dir, "rebuilt.db"))
	if err != nil {
		t.Fatal(err)
	}
	if !report.Identical() {
		t.Fatalf("rebuilt database differs:\n%s", report)
	}
}
