package condense

import (
	"context"
	"testing"

	"github.com/ctxpipe/ctxpipe/internal/transcripts"
	"github.com/ctxpipe/ctxpipe/prompts"
	"github.com/ctxpipe/ctxpipe/schema"
)

// condenseSpan is how many messages one offline condense covers in the
// chained runs below: about what a 32 k window holds before it triggers.
const condenseSpan = 120

// condenseChain condenses a run the way the engine does over a long
// conversation: span after span, each request opening with the summary of
// the spans before it and closing with the engine's final instruction. It
// returns every summary text, in order.
func condenseChain(tb testing.TB, msgs []schema.Message) []string {
	tb.Helper()
	var out []string
	var prev []schema.Message
	for start := 0; start < len(msgs); start += condenseSpan {
		req := append(append([]schema.Message(nil), prev...), msgs[start:min(start+condenseSpan, len(msgs))]...)
		req = append(req, textMsg(schema.RoleUser, prompts.FinalInstruction))
		sum, err := (&Offline{}).Summarize(context.Background(), schema.SummaryRequest{Prompt: prompts.Detailed, Messages: req})
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, sum.Text)
		prev = []schema.Message{{Turn: schema.Turn{Role: schema.RoleUser, Content: schema.TextContent(sum.Text)},
			IsSummary: true, CondenseID: "chain"}}
	}
	return out
}

// BenchmarkOfflineCondense is the offline condenser over the 43 runs in
// spans of condenseSpan messages, each span after the previous summary, as
// the engine condenses a long conversation (87 summaries per op).
func BenchmarkOfflineCondense(b *testing.B) {
	runs := transcripts.Runs(b, transcriptDir)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		for _, r := range runs {
			condenseChain(b, r.Messages)
		}
	}
}
