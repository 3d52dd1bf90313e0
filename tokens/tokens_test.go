package tokens

import (
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	tiktoken "github.com/pkoukk/tiktoken-go"
	tiktokenloader "github.com/pkoukk/tiktoken-go-loader"

	"github.com/ctxpipe/ctxpipe/internal/transcripts"
	"github.com/ctxpipe/ctxpipe/schema"
)

// words counts whitespace-separated words: an easy TextCounter to reason about.
type words struct{}

func (words) Count(s string) int { return len(strings.Fields(s)) }

func TestCountingRules(t *testing.T) {
	img := func(data string) schema.Block {
		return schema.Block{Type: schema.BlockImage, Source: &schema.ImageSource{Type: "base64", MediaType: "image/png", Data: data}}
	}
	text := func(s string) schema.Block { return schema.Block{Type: schema.BlockText, Text: s} }
	nested := schema.BlockContent(text("a b"), img("xx"), schema.Block{Type: "document"})
	str := schema.TextContent("one two three")
	cases := []struct {
		name    string
		content schema.Content
		fudge   float64
		want    int
	}{
		{"empty string", schema.TextContent(""), 1.5, 0},
		{"empty blocks", schema.BlockContent(), 1.5, 0},
		{"string", schema.TextContent("one two three"), 1, 3},
		{"fudge rounds up once", schema.TextContent("one two three"), 1.5, 5}, // ceil(4.5)
		{"fudge on the sum, not per block", schema.BlockContent(text("a"), text("b"), text("c")), 1.5, 5},
		{"image with data: ceil(sqrt(len))", schema.BlockContent(img(strings.Repeat("A", 1000))), 1, 32},
		{"image without data: 300", schema.BlockContent(schema.Block{Type: schema.BlockImage, Source: &schema.ImageSource{Type: "url", URL: "https://x/y.png"}}), 1, 300},
		{"reasoning is not counted", schema.BlockContent(schema.Block{Type: schema.BlockReasoning, Text: "lots of hidden thought"}), 1, 0},
		// "Tool: bash\nArguments: {\"cmd\":\"ls -la\"}" → 5 words
		{"tool_use", schema.BlockContent(schema.Block{Type: schema.BlockToolUse, ID: "c1", Name: "bash", Input: json.RawMessage(`{"cmd":"ls -la"}`)}), 1, 5},
		// "Tool Result (c1)\n[Error]\none two three" → 7 words
		{"tool_result error", schema.BlockContent(schema.Block{Type: schema.BlockToolResult, ToolUseID: "c1", IsError: true, Content: &str}), 1, 7},
		// items: "a b", "[Image content]", "[Unsupported content block: document]"
		{"tool_result items", schema.BlockContent(schema.Block{Type: schema.BlockToolResult, ToolUseID: "c1", Content: &nested}), 1, 3 + 2 + 2 + 4},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := (Counter{Text: words{}, Fudge: c.fudge}).Content(c.content); got != c.want {
				t.Fatalf("count = %d, want %d", got, c.want)
			}
		})
	}
}

func TestSerializations(t *testing.T) {
	// The input's own key order and characters are counted: re-encoding
	// through a map would sort keys and escape <>&.
	in := json.RawMessage(`{"z":"a<b>&c","a":1}`)
	b := schema.Block{Type: schema.BlockToolUse, Name: "edit", Input: in}
	if got, want := SerializeToolUse(&b), "Tool: edit\nArguments: {\"z\":\"a<b>&c\",\"a\":1}"; got != want {
		t.Fatalf("got %q want %q", got, want)
	}
	b.Input = json.RawMessage("{ \"z\" : \"a b\",\n \"a\": 1 }")
	if got, want := SerializeToolUse(&b), "Tool: edit\nArguments: {\"z\":\"a b\",\"a\":1}"; got != want {
		t.Fatalf("whitespace outside strings is not counted: %q", got)
	}
	b.Input = nil
	if got := SerializeToolUse(&b); got != "Tool: edit" {
		t.Fatalf("no input: %q", got)
	}
	empty := schema.TextContent("")
	r := schema.Block{Type: schema.BlockToolResult, ToolUseID: "x", Content: &empty}
	if got := SerializeToolResult(&r); got != "Tool Result (x)\n" {
		t.Fatalf("empty string content: %q", got)
	}
}

// A tool call or result is serialized in one allocation of its exact size,
// whatever its content: the counting of every turn builds them.
func TestSerializationsAllocateOnce(t *testing.T) {
	text := schema.TextContent(strings.Repeat("line of output\n", 200))
	parts := schema.BlockContent(
		schema.Block{Type: schema.BlockText, Text: strings.Repeat("x", 300)},
		schema.Block{Type: schema.BlockImage},
		schema.Block{Type: "audio"},
		schema.Block{Type: schema.BlockText, Text: "done"})
	results := []schema.Block{
		{Type: schema.BlockToolResult, ToolUseID: "call_1", Content: &text},
		{Type: schema.BlockToolResult, ToolUseID: "call_2", IsError: true, Content: &parts},
		{Type: schema.BlockToolResult, ToolUseID: "call_3", IsError: true},
	}
	for i := range results {
		b := &results[i]
		if got, want := toolResultLen(b), len(SerializeToolResult(b)); got != want {
			t.Errorf("%s: toolResultLen %d, serialized %d bytes", b.ToolUseID, got, want)
		}
		if n := testing.AllocsPerRun(20, func() { SerializeToolResult(b) }); n != 1 {
			t.Errorf("%s: %v allocations, want 1", b.ToolUseID, n)
		}
	}
	use := schema.Block{Type: schema.BlockToolUse, Name: "bash", Input: json.RawMessage(`{"command":"` + strings.Repeat("ls -la; ", 100) + `"}`)}
	if n := testing.AllocsPerRun(20, func() { SerializeToolUse(&use) }); n != 1 {
		t.Errorf("tool use: %v allocations, want 1", n)
	}
}

func TestChars(t *testing.T) {
	cases := map[string]int{
		"":          0,
		"abcd":      1,                              // 4 × 0.25
		"abcde":     2,                              // 1.25 → 2
		"日本語":       4,                              // 3 × 1.3 = 3.9 → 4
		"go 日本":     int(math.Ceil(3*0.25 + 2*1.3)), // 3.35 → 4
		"\xff\xfe":  3,                              // invalid bytes count as non-ASCII runes
		"emoji 🙂ok": int(math.Ceil(8*0.25 + 1.3)),
	}
	for s, want := range cases {
		if got := (Chars{}).Count(s); got != want {
			t.Errorf("Chars(%q) = %d, want %d", s, got, want)
		}
	}
}

// TestExactMatchesTiktoken counts every message of the real transcripts with
// the engine's counter and with pkoukk/tiktoken-go as the oracle.
func TestExactMatchesTiktoken(t *testing.T) {
	tiktoken.SetBpeLoader(tiktokenloader.NewOfflineLoader())
	enc, err := tiktoken.GetEncoding(tiktoken.MODEL_O200K_BASE)
	if err != nil {
		t.Fatal(err)
	}
	oracle := Counter{Text: counterFunc(func(s string) int { return len(enc.Encode(s, nil, nil)) }), Fudge: 1.5}
	p := schema.Profile{}
	ours, err := ForProfile(&p)
	if err != nil {
		t.Fatal(err)
	}
	files := transcripts.Files(t, "../../shared/data/transcripts")
	limit := 4
	if testing.Short() {
		limit = 1
	}
	n := 0
	for _, f := range files[:min(limit, len(files))] {
		for _, l := range transcripts.Read(t, f) {
			if a, b := ours.Content(l.Turn.Content), oracle.Content(l.Turn.Content); a != b {
				t.Fatalf("%s %s: ours %d, tiktoken %d", filepath.Base(f), l.Turn.ID, a, b)
			}
			n++
		}
	}
	t.Logf("%d messages counted identically", n)
}

type counterFunc func(string) int

func (f counterFunc) Count(s string) int { return f(s) }

// TestCountsOffline proves counting needs no network: every HTTP request
// fails, and counting still works and makes none.
func TestCountsOffline(t *testing.T) {
	orig := http.DefaultTransport
	var tried []string
	http.DefaultTransport = roundTripFunc(func(r *http.Request) (*http.Response, error) {
		tried = append(tried, r.URL.String())
		return nil, errors.New("no network in this test")
	})
	t.Setenv("HTTPS_PROXY", "http://127.0.0.1:1")
	t.Setenv("HTTP_PROXY", "http://127.0.0.1:1")
	defer func() { http.DefaultTransport = orig }()
	p := schema.Profile{}
	c, err := ForProfile(&p)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Content(schema.TextContent("hello world")); got != 3 { // 2 tokens × 1.5
		t.Fatalf("count %d", got)
	}
	if len(tried) > 0 {
		t.Fatalf("counting tried the network: %v", tried)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A tool call's input is counted as JSON.stringify(JSON.parse(input))
// writes it, however the agent escaped it (conformance run, D3).
func TestStringifyJSON(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"path":"a.go","n":1}`, `{"path":"a.go","n":1}`},
		{`{ "a" : [ 1 , 2 ],"b" :"x y" }`, `{"a":[1,2],"b":"x y"}`},
		{`{"path":"\u00e9t\u00e9.go"}`, `{"path":"été.go"}`},
		{`{"q":"a\/b"}`, `{"q":"a/b"}`},
		{`{"s":"\u003cdiv\u003e \u0026"}`, `{"s":"<div> &"}`},
		{`{"t":"line\nnext\ttab\u0001\u001F"}`, `{"t":"line\nnext\ttab\u0001\u001f"}`},
		{`{"q":"say \"hi\" \\ back"}`, `{"q":"say \"hi\" \\ back"}`},
		{`{"e":"\ud83d\ude42"}`, `{"e":"🙂"}`},
		{`{"lone":"\ud800x"}`, `{"lone":"\ud800x"}`},
		{`{"\u006bey":"v"}`, `{"key":"v"}`},
		{`{"broken":"\q"}`, `{"broken":"\q"}`},
	} {
		if got := string(stringifyJSON([]byte(c.in))); got != c.want {
			t.Errorf("%s: got %s, want %s", c.in, got, c.want)
		}
	}
	escaped := schema.Block{Type: schema.BlockToolUse, Name: "read_file", Input: []byte(`{"path":"\u30c6\u30b9\u30c8.go"}`)}
	plain := schema.Block{Type: schema.BlockToolUse, Name: "read_file", Input: []byte(`{"path":"テスト.go"}`)}
	if a, b := SerializeToolUse(&escaped), SerializeToolUse(&plain); a != b {
		t.Fatalf("the same call counts differently by its escapes:\n%s\n%s", a, b)
	}
}

// Whatever valid JSON an agent sends, what is counted means the same value,
// is compact, and is written again unchanged.
func FuzzStringifyJSON(f *testing.F) {
	for _, s := range []string{`{"path":"a.go"}`, `{ "a" : [1, 2.5e3, true, null] }`, `{"s":"\u00e9\ud83d\ude42\u003c\n\"\\"}`,
		`["\ud800", "\udc00x", "\u0000\u001f\u007f"]`, `"x"`, `{"k":{"n":[{"deep":"\t"}]}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var want any
		if json.Unmarshal(raw, &want) != nil {
			return
		}
		out := stringifyJSON(raw)
		var got any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("%q became %q, which does not parse: %v", raw, out, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q became %q: a different value", raw, out)
		}
		if !isCompact(out) {
			t.Fatalf("%q became %q: not compact", raw, out)
		}
		if again := stringifyJSON(out); string(again) != string(out) {
			t.Fatalf("%q: %q, then %q", raw, out, again)
		}
	})
}
