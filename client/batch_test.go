package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/client"
	"github.com/ctxpipe/ctxpipe/client/clienttest"
	"github.com/ctxpipe/ctxpipe/internal/natstest"
	"github.com/ctxpipe/ctxpipe/schema"
)

// exchange is a tool call and its result after a user's request: three
// turns that belong together.
func exchange(conv string, ts int64) []schema.Turn {
	return []schema.Turn{
		{ID: uuid.NewString(), ConversationID: conv, TS: ts, Role: schema.RoleUser, Content: schema.TextContent("List the files.")},
		{ID: uuid.NewString(), ConversationID: conv, TS: ts + 1, Role: schema.RoleAssistant,
			Content: schema.BlockContent(schema.Block{Type: schema.BlockToolUse, ID: "call_1", Name: "bash", Input: []byte(`{"command":"ls"}`)})},
		{ID: uuid.NewString(), ConversationID: conv, TS: ts + 2, Role: schema.RoleUser,
			Content: schema.BlockContent(schema.Block{Type: schema.BlockToolResult, ToolUseID: "call_1", Content: &schema.Content{Text: "a.go b.go"}})},
	}
}

// agentTurns is the number of agent turns conv holds once input waitFor is
// applied.
func agentTurns(t *testing.T, c *client.Client, conv, waitFor string) int {
	t.Helper()
	h, err := c.History(t.Context(), conv, client.View(schema.ViewFull), client.WaitFor(waitFor))
	if err != nil {
		t.Fatal(err)
	}
	return len(h.Messages)
}

// A tenant's agent records several turns as one atomic batch through the
// server's service import (and CTX_IN's partition transform): all of them,
// or, when the batch does not complete, none.
func TestAppendAllThroughTheTenantImport(t *testing.T) {
	_, url := natstest.RunWithConfig(t, "../nats.conf")
	clienttest.New(t, clienttest.WithConn(bus.ConnConfig{URL: url, User: "ctxpipe", Password: "ctxpipe-demo-password"}))
	ctx := t.Context()
	agent, err := client.Connect(bus.ConnConfig{URL: url, User: "acme-agent", Password: "acme-agent-demo-password"})
	if err != nil {
		t.Fatal(err)
	}
	defer agent.Close()

	turns := exchange("b1", 1_750_000_000_000)
	ids, err := agent.AppendAll(ctx, turns)
	if err != nil {
		t.Fatal(err)
	}
	if n := agentTurns(t, agent, "b1", ids[2]); n != 3 {
		t.Fatalf("%d turns recorded, want the batch's 3", n)
	}
	// The same batch again: its turns are in the stream, nothing is added.
	if _, err := agent.AppendAll(ctx, turns); !errors.Is(err, client.ErrBatchDuplicate) {
		t.Fatalf("the batch sent again: %v, want ErrBatchDuplicate", err)
	}
	// A batch whose first turn is in the stream and whose second is not:
	// refused whole, so the new turn is not recorded either.
	more := exchange("b1", 1_750_000_001_000)
	if _, err := agent.AppendAll(ctx, []schema.Turn{turns[2], more[0]}); !errors.Is(err, client.ErrBatchDuplicate) {
		t.Fatalf("a batch with a duplicate: %v, want ErrBatchDuplicate", err)
	}

	// A batch that cannot complete (its second turn is larger than the
	// server takes): its first turn, sent already, is never stored.
	broken := exchange("b2", 1_750_000_000_000)
	broken[1].Content = schema.TextContent(strings.Repeat("x", bus.MaxMsgSize+1))
	if _, err := agent.AppendAll(ctx, broken); err == nil {
		t.Fatal("a batch with a turn over the size limit was stored")
	}
	// A batch with a gap, made by hand through the same import: the stream
	// refuses its commit, and stores none of it.
	nc, err := nats.Connect(url, nats.UserInfo("acme-agent", "acme-agent-demo-password"), nats.CustomInboxPrefix("_INBOX_acme-agent"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	gap := exchange("b2", 1_750_000_000_100)
	for i, seq := range []string{"1", "3"} {
		data, _ := schema.Marshal(gap[i])
		m := nats.NewMsg(schema.InputSubject("b2", schema.KindTurn))
		m.Data = data
		m.Header.Set(jetstream.MsgIDHeader, gap[i].ID)
		m.Header.Set("Nats-Batch-Id", "gap-batch")
		m.Header.Set("Nats-Batch-Sequence", seq)
		if i == 1 {
			m.Header.Set("Nats-Batch-Commit", "1")
		}
		resp, err := nc.RequestMsgWithContext(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		if i == 1 && !strings.Contains(string(resp.Data), `"error"`) {
			t.Fatalf("the commit of a batch with a gap was answered %s", resp.Data)
		}
	}
	// Only what comes after is recorded.
	id, err := agent.Append(ctx, schema.Turn{ConversationID: "b2", Role: schema.RoleUser, Content: schema.TextContent("Start over.")})
	if err != nil {
		t.Fatal(err)
	}
	if n := agentTurns(t, agent, "b2", id); n != 1 {
		t.Fatalf("b2 holds %d turns, want only the one appended after the broken batches", n)
	}
}

// A stream that does not take atomic batches stores nothing of one, and
// says so: the caller publishes the turns one by one instead.
func TestAppendAllWithoutAtomicPublish(t *testing.T) {
	svc := clienttest.New(t)
	c, err := client.Connect(bus.ConnConfig{URL: svc.URL})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	nc, err := nats.Connect(svc.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	s, err := js.Stream(ctx, bus.StreamIn)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := svc.WaitConsuming(wctx); err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	if !cfg.AllowAtomicPublish {
		t.Fatal("CTX_IN was made without atomic publish")
	}
	cfg.AllowAtomicPublish = false
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	turns := exchange("b3", 1_750_000_000_000)
	if _, err := c.AppendAll(ctx, turns); !errors.Is(err, client.ErrNoAtomicBatch) {
		t.Fatalf("AppendAll without atomic publish: %v, want ErrNoAtomicBatch", err)
	}
	for _, turn := range turns {
		if _, err := c.Append(ctx, turn); err != nil {
			t.Fatal(err)
		}
	}
	if n := agentTurns(t, c, "b3", turns[2].ID); n != 3 {
		t.Fatalf("%d turns after appending them one by one, want 3 (none from the refused batch)", n)
	}
}
