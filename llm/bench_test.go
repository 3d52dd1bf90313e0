package llm

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ctxpipe/ctxpipe/internal/transcripts"
	"github.com/ctxpipe/ctxpipe/prompts"
	"github.com/ctxpipe/ctxpipe/schema"
)

// transcript is one shared real agent run as stored messages.
type transcript struct {
	name string
	msgs []schema.Message
}

// allTranscripts loads the 43 real runs the benchmarks and the equivalence
// tests measure: synthetic inputs miss the long heredocs, pipes and
// tracebacks that make extraction expensive.
func allTranscripts(tb testing.TB) []transcript {
	tb.Helper()
	var out []transcript
	for _, file := range transcripts.Files(tb, transcriptDir) {
		var msgs []schema.Message
		for _, l := range transcripts.Read(tb, file) {
			msgs = append(msgs, schema.Message{Turn: l.Turn})
		}
		out = append(out, transcript{strings.TrimSuffix(filepath.Base(file), ".jsonl"), msgs})
	}
	return out
}

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

// BenchmarkFilesTouched is the mechanical files list over every message of
// the 43 runs, one call per run (7.7 k messages, 3.9 k tool calls per op).
func BenchmarkFilesTouched(b *testing.B) {
	runs := allTranscripts(b)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		for _, r := range runs {
			FilesTouched(r.msgs)
		}
	}
}

// BenchmarkOfflineCondense is the offline condenser over the 43 runs in
// spans of condenseSpan messages, each span after the previous summary, as
// the engine condenses a long conversation (87 summaries per op).
func BenchmarkOfflineCondense(b *testing.B) {
	runs := allTranscripts(b)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		for _, r := range runs {
			condenseChain(b, r.msgs)
		}
	}
}
