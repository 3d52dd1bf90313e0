package engine

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/ctxpipe/ctxpipe/schema"
)

// benchHistory is a conversation of n messages with tool calls and results,
// counted with the exact counter, as the service stores it.
func benchHistory(b *testing.B, n int) (*Conversation, *Engine) {
	b.Helper()
	e := NewEngine(SummarizerFunc(func(context.Context, schema.SummaryRequest) (schema.Summary, error) {
		return schema.Summary{Text: "a short summary of the work so far"}, nil
	}))
	e.Log = slog.New(slog.DiscardHandler)
	// A window this large never triggers, so building the history is cheap.
	p := schema.Profile{ID: "bench", ContextWindow: 1 << 30}
	c := NewConversation("bench", p, e)
	ctx := context.Background()
	for i := 0; i < n; i++ {
		t := schema.Turn{ID: msgID(i), ConversationID: "bench", TS: int64(1 + 10*i)}
		switch i % 4 {
		case 0:
			t.Role, t.Content = schema.RoleUser, schema.TextContent(fmt.Sprintf("Please look at step %d of the build and fix what fails.", i))
		case 1:
			t.Role, t.Content = schema.RoleAssistant, schema.BlockContent(
				schema.Block{Type: schema.BlockText, Text: "Running the tests."},
				toolUse(fmt.Sprintf("call_%d", i), "bash", `{"command":"go test ./..."}`))
		case 2:
			t.Role, t.Content = schema.RoleUser, schema.BlockContent(toolResult(fmt.Sprintf("call_%d", i-1), strings.Repeat("ok  \tgithub.com/x/y\t0.01s\n", 8)))
		case 3:
			t.Role, t.Content = schema.RoleAssistant, schema.TextContent("All packages pass; moving on to the next step.")
		}
		if _, err := c.Append(ctx, t); err != nil {
			b.Fatal(err)
		}
	}
	return c, e
}

// BenchmarkDecideTurn is the per-turn cost when no action is needed: it must
// not grow with the history (the state carries the context size; the
// history is not even loaded).
func BenchmarkDecideTurn(b *testing.B) {
	for _, n := range []int{100, 10000} {
		b.Run(fmt.Sprintf("history=%d", n), func(b *testing.B) {
			c, e := benchHistory(b, n)
			p := c.Profile
			turn := schema.Turn{ID: msgID(n), ConversationID: "bench", TS: int64(10 * (n + 1)), Role: schema.RoleUser,
				Content: schema.TextContent("Next, please update the README with the new flags and rerun the checks.")}
			in := schema.Input{Kind: schema.KindTurn, ID: turn.ID, ConversationID: "bench", TS: turn.TS, Turn: &turn}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := e.Apply(ctx, c.State, memHistory{c}, &p, in); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkCondense10k is one condense decision on a 10,000-message
// conversation (the summarizer answers at once): plan, summarize, tag,
// recount, verify. It is linear in the history and happens rarely.
func BenchmarkCondense10k(b *testing.B) {
	for _, s := range []schema.Strategy{schema.StrategyKeepTail, schema.StrategyFreshStart, schema.StrategyPreserveFraction} {
		b.Run(string(s), func(b *testing.B) {
			c, e := benchHistory(b, 10000)
			p := c.Profile
			p.Strategy = s
			in := schema.Input{Kind: schema.KindCondense, ID: msgID(99999), ConversationID: "bench", TS: 1 << 40, Trigger: schema.TriggerManual}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				ch, err := e.Apply(ctx, c.State, memHistory{c}, &p, in)
				if err != nil || len(ch.Events) != 2 {
					b.Fatal(err, len(ch.Events))
				}
			}
		})
	}
}

// BenchmarkTruncate10k is one sliding-window truncation over 10,000 messages.
func BenchmarkTruncate10k(b *testing.B) {
	c, _ := benchHistory(b, 10000)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, ok := PlanTruncation(c.Messages, TruncateFraction, "t", lenCount); !ok {
			b.Fatal("nothing truncated")
		}
	}
}

// BenchmarkEffectiveHistory10k is the history query's filter over 10,000 messages.
func BenchmarkEffectiveHistory10k(b *testing.B) {
	c, _ := benchHistory(b, 10000)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if len(EffectiveHistory(c.Messages)) != 10000 {
			b.Fatal("wrong length")
		}
	}
}
