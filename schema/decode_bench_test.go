package schema_test

import (
	"testing"

	"github.com/ctxpipe/ctxpipe/internal/transcripts"
	"github.com/ctxpipe/ctxpipe/schema"
)

// BenchmarkDecodeTranscripts decodes every turn of the real agent runs as
// the pipeline does (schema.DecodeInput), reporting bytes per second.
func BenchmarkDecodeTranscripts(b *testing.B) {
	lines := transcripts.All(b, "../../shared/data/transcripts")
	subjects := make([]string, len(lines))
	var n int64
	for i, l := range lines {
		subjects[i] = schema.InputSubject(l.Turn.ConversationID, schema.KindTurn)
		n += int64(len(l.Raw))
	}
	b.SetBytes(n)
	b.ReportAllocs()
	for b.Loop() {
		for i, l := range lines {
			if _, err := schema.DecodeInput(subjects[i], l.Raw); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// TestDecodeTranscriptsAgree checks that the input decoder reads every turn
// of the real agent runs as the stored-message decoder (encoding/json) does.
func TestDecodeTranscriptsAgree(t *testing.T) {
	for _, l := range transcripts.All(t, "../../shared/data/transcripts") {
		in, err := schema.DecodeInput(schema.InputSubject(l.Turn.ConversationID, schema.KindTurn), l.Raw)
		if err != nil {
			t.Fatalf("turn %s: %v", l.Turn.ID, err)
		}
		got, err := schema.Marshal(in.Turn)
		if err != nil {
			t.Fatal(err)
		}
		want, err := schema.Marshal(&l.Turn)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Fatalf("turn %s decodes differently:\n got %.300s\nwant %.300s", l.Turn.ID, got, want)
		}
	}
}
