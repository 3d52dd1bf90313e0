package schema_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ctxpipe/ctxpipe/schema"
)

// The fuzz targets check that decoding never panics and that whatever decodes
// re-encodes to a fixed point: ctxpipe stores turns by encoding them and reads
// them back by decoding, so a turn must survive that trip unchanged.
// Run longer with e.g. go test -fuzz FuzzDecodeInput -fuzztime 60s ./schema.

// addTurnSeeds adds every turn example and the first lines of a few real
// transcripts, each with the conversation id it names.
func addTurnSeeds(f *testing.F, add func(conv string, data []byte)) {
	f.Helper()
	for _, dir := range []string{"valid", "invalid", "divergent"} {
		files, err := filepath.Glob(filepath.Join("testdata/turns", dir, "*.json"))
		if err != nil || len(files) == 0 {
			f.Fatalf("no seeds in testdata/turns/%s: %v", dir, err)
		}
		for _, file := range files {
			data, err := os.ReadFile(file)
			if err != nil {
				f.Fatal(err)
			}
			add(seedConv(data), data)
		}
	}
	files, err := filepath.Glob(filepath.Join(transcriptDir, "*.jsonl"))
	if err != nil || len(files) < 3 {
		f.Fatalf("transcripts in %s: %d files, %v", transcriptDir, len(files), err)
	}
	for _, file := range files[:3] {
		fh, err := os.Open(file)
		if err != nil {
			f.Fatal(err)
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(nil, 16<<20)
		// The first four lines: the task prompt, a tool call with its
		// reasoning or text, its result, the next call.
		for i := 0; i < 4 && sc.Scan(); i++ {
			line := bytes.Clone(sc.Bytes())
			add(seedConv(line), line)
		}
		fh.Close()
	}
}

func seedConv(data []byte) string {
	var p struct {
		ConversationID string `json:"conversation_id"`
	}
	_ = json.Unmarshal(data, &p)
	if p.ConversationID == "" {
		return "task-42"
	}
	return p.ConversationID
}

func FuzzDecodeInput(f *testing.F) {
	addTurnSeeds(f, func(conv string, data []byte) { f.Add(conv, data) })
	// The hostile shapes of hostile_test.go, small, for the fuzzer to mutate.
	for _, h := range [][]byte{
		deepToolResult(4 << 10),
		toolUseTurn(nestValue(schema.MaxToolInputDepth)),
		toolUseTurn(nestValue(schema.MaxToolInputDepth + 1)),
		toolUseTurn(`{"p":"` + "\xe9\xff" + `","s":"\udc00"}`),
		rawTurn(`[{"type":"tool_result","tool_use_id":"a","content":[{"type":"text","text":"x","content":[{"type":"text"}]}]}]`),
		rawTurn(`"` + strings.Repeat("[{", 50) + `\"\\"`),
	} {
		f.Add("task-42", h)
	}
	f.Add("_invalid", []byte(`{"id":"`+testID+`","conversation_id":"_invalid","ts":5,"role":"user","content":"x"}`))
	f.Add("task-42", []byte(`{"id":"`+testID+`","conversation_id":"task-42","ts":5,"role":"assistant","content":"x",`+
		`"usage":{"input_tokens":9223372036854775807,"output_tokens":9223372036854775807}}`))
	f.Fuzz(func(t *testing.T, conv string, data []byte) {
		subject := schema.InputSubject(conv, schema.KindTurn)
		in, err := schema.DecodeInput(subject, data)
		peeked := schema.PeekID(data) // whatever the bytes, it returns
		if err != nil {
			if schema.ReasonOf(err) == "" {
				t.Fatalf("rejection without a reason: %v", err)
			}
			return
		}
		if in.Turn == nil || in.ID != in.Turn.ID || in.TS != in.Turn.TS || in.ConversationID != conv {
			t.Fatalf("input header disagrees with its turn: %+v", in)
		}
		// PeekID (which names a rejection the decoder makes) and the
		// decoder agree on the id of every payload the decoder accepts.
		if schema.CanonicalID(peeked) != in.ID {
			t.Fatalf("PeekID read %q, the decoder %q", peeked, in.ID)
		}
		if u := in.Turn.Usage; u != nil && (u.Total() <= 0 || u.Total() > schema.MaxTokenCount) {
			t.Fatalf("accepted a usage out of bounds: %+v", *u)
		}
		enc1, err := schema.Marshal(in.Turn)
		if err != nil {
			t.Fatalf("encode a decoded turn: %v", err)
		}
		// What is stored must be readable by every JSON reader.
		if !utf8.Valid(enc1) || !json.Valid(enc1) {
			t.Fatalf("stored form is not UTF-8 JSON: %q", enc1)
		}
		again, err := schema.DecodeInput(subject, enc1)
		if err != nil {
			t.Fatalf("re-decode %s: %v", enc1, err)
		}
		want := compactInputs(*in.Turn)
		if !reflect.DeepEqual(*again.Turn, want) {
			t.Fatalf("round trip changed the turn:\n got %#v\nwant %#v", *again.Turn, want)
		}
		enc2, err := schema.Marshal(again.Turn)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(enc1, enc2) {
			t.Fatalf("encoding is not stable:\n%s\n%s", enc1, enc2)
		}
	})
}

func FuzzContent(f *testing.F) {
	for _, s := range []string{`""`, `"hi"`, `null`, `[]`, `42`, `{}`, ` [ ]`,
		`[{"type":"text","text":"a<b>&c"}]`,
		`[{"type":"tool_use","id":"c","name":"n","input":{"z":1,"a":[1,2]}}]`,
		`[{"type":"tool_use","id":"c","name":"n","input":{ "spaced" : true }}]`,
		`[{"type":"tool_result","tool_use_id":"c","content":[{"type":"image","source":{"type":"url","url":"u"}}]}]`,
		`[{"type":"text","content":[{"type":"text","content":""}]}]`,
	} {
		f.Add([]byte(s))
	}
	addTurnSeeds(f, func(_ string, data []byte) {
		var p struct {
			Content json.RawMessage `json:"content"`
		}
		if json.Unmarshal(data, &p) == nil && len(p.Content) > 0 {
			f.Add([]byte(p.Content))
		}
	})
	f.Fuzz(func(t *testing.T, data []byte) {
		var c schema.Content
		if json.Unmarshal(data, &c) != nil {
			return
		}
		enc1, err := schema.Marshal(c)
		if err != nil {
			t.Fatalf("encode decoded content: %v", err)
		}
		var again schema.Content
		if err := json.Unmarshal(enc1, &again); err != nil {
			t.Fatalf("re-decode %s: %v", enc1, err)
		}
		if again.IsBlocks != c.IsBlocks {
			t.Fatalf("form changed: blocks=%v, then %v", c.IsBlocks, again.IsBlocks)
		}
		if want := compactContent(c); !reflect.DeepEqual(again, want) {
			t.Fatalf("round trip changed the content:\n got %#v\nwant %#v", again, want)
		}
		enc2, err := schema.Marshal(again)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(enc1, enc2) {
			t.Fatalf("encoding is not stable:\n%s\n%s", enc1, enc2)
		}
	})
}

// compactInputs returns t with every tool input compacted. encoding/json
// compacts a json.RawMessage when it encodes one, so insignificant whitespace
// inside a tool input is the one thing the first round trip may drop; key
// order and characters must survive (TestToolUseInputBytesPreserved).
func compactInputs(t schema.Turn) schema.Turn {
	t.Content = compactContent(t.Content)
	return t
}

func compactContent(c schema.Content) schema.Content {
	if c.Blocks == nil {
		return c
	}
	blocks := make([]schema.Block, len(c.Blocks))
	for i, b := range c.Blocks {
		if b.Input != nil {
			var buf bytes.Buffer
			if err := json.Compact(&buf, b.Input); err == nil {
				b.Input = json.RawMessage(buf.Bytes())
			}
		}
		if b.Content != nil {
			inner := compactContent(*b.Content)
			b.Content = &inner
		}
		blocks[i] = b
	}
	c.Blocks = blocks
	return c
}
