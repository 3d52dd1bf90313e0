package textfacts

import (
	"testing"

	"github.com/ctxpipe/ctxpipe/internal/transcripts"
)

// BenchmarkFilesTouched is the mechanical files list over every message of
// the 43 runs, one call per run (7.7 k messages, 3.9 k tool calls per op).
func BenchmarkFilesTouched(b *testing.B) {
	runs := transcripts.Runs(b, transcriptDir)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		for _, r := range runs {
			FilesTouched(r.Messages)
		}
	}
}
