package schema_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
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

// v1Marshal is what schema.Marshal wrote with encoding/json.
func v1Marshal(t *testing.T, v any) string {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	// The one deliberate difference: U+2028 and U+2029 are written as
	// themselves (schema's marshalOptions say why).
	out := strings.NewReplacer(`\u2028`, "\u2028", `\u2029`, "\u2029").Replace(buf.String())
	return strings.TrimSuffix(out, "\n")
}

// TestMarshalAsEncodingJSON checks that schema.Marshal writes, byte for
// byte, what encoding/json wrote (but for U+2028 and U+2029, see v1Marshal):
// stored bodies and replies keep their form.
func TestMarshalAsEncodingJSON(t *testing.T) {
	check := func(name string, v any) {
		t.Helper()
		got, err := schema.Marshal(v)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if want := v1Marshal(t, v); string(got) != want {
			t.Fatalf("%s:\n got %.400s\nwant %.400s", name, got, want)
		}
	}
	for i, l := range transcripts.All(t, "../../shared/data/transcripts") {
		check(l.Turn.ID, &l.Turn)
		m := schema.Message{Turn: l.Turn, Tokens: i, IsSummary: i%3 == 0, CondenseID: "c", CondenseParent: "p"}
		check(l.Turn.ID+" message", &m)
		check(l.Turn.ID+" content", l.Turn.Content)
	}
	check("empty blocks", schema.BlockContent())
	check("html", schema.TextContent("<a href=\"x\">&amp;</a>\u2028\u2029"))
	files, _ := filepath.Glob("testdata/events/valid/*.json")
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		e, err := schema.DecodeEvent(data)
		if err != nil {
			continue
		}
		check(f, e)
	}
	if len(files) == 0 {
		t.Fatal("no event testdata")
	}
}

// BenchmarkMarshalMessages encodes every transcript turn as a stored
// message body: schema.Marshal beside encoding/json, which it replaced.
func BenchmarkMarshalMessages(b *testing.B) {
	lines := transcripts.All(b, "../../shared/data/transcripts")
	msgs := make([]schema.Message, len(lines))
	for i, l := range lines {
		msgs[i] = schema.Message{Turn: l.Turn, Tokens: i}
	}
	b.Run("schema.Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			for i := range msgs {
				if _, err := schema.Marshal(&msgs[i]); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			for i := range msgs {
				var buf bytes.Buffer
				enc := json.NewEncoder(&buf)
				enc.SetEscapeHTML(false)
				if err := enc.Encode(&msgs[i]); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}
