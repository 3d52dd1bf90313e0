package main

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strings"

	"github.com/google/uuid"

	"github.com/ctxpipe/ctxpipe/schema"
)

// Size scales the synthetic turns.
type Size string

// The sizes load generates.
const (
	// SizeRealistic: user requests ~100–600 B, tool results 200 B–8 KiB,
	// as in real coding-agent runs.
	SizeRealistic Size = "realistic"
	// SizeSmall is a quarter of that: many cheap turns, for throughput of
	// the pipeline itself.
	SizeSmall Size = "small"
	// SizeLarge is four times that: tool results up to 32 KiB, so that
	// windows fill and condensing runs often.
	SizeLarge Size = "large"
)

// ParseSize checks a --size value.
func ParseSize(s string) (Size, error) {
	switch z := Size(s); z {
	case SizeRealistic, SizeSmall, SizeLarge:
		return z, nil
	}
	return "", fmt.Errorf("unknown size %q (want realistic, small or large)", s)
}

func (s Size) scale() float64 {
	switch s {
	case SizeSmall:
		return 0.25
	case SizeLarge:
		return 4
	}
	return 1
}

// GenEpoch is the first timestamp GenerateTurns uses (2025-06-15 UTC).
const GenEpoch int64 = 1_750_000_000_000

// GenerateTurns returns m synthetic turns of a coding-agent conversation:
// a user request, then assistant turns (sometimes reasoning, often a short
// text, one or two tool_use blocks with JSON input) answered by user turns
// of tool_result blocks (code, logs, test output; now and then is_error),
// sometimes with a follow-up remark from the user. The last turn, when it
// is the assistant's, is a final text answer. The result depends only on
// the arguments, ids included.
func GenerateTurns(seed int64, conv string, m int, size Size) []schema.Turn {
	g := newGenerator(seed, conv, size, GenEpoch)
	out := make([]schema.Turn, 0, m)
	for i := 0; i < m; i++ {
		out = append(out, g.next(i == m-1))
	}
	return out
}

// generator produces one conversation's turns one at a time, so load can
// interleave thousands of conversations without holding them all.
type generator struct {
	rng     *rand.Rand
	conv    string
	scale   float64
	ts      int64
	n       int
	pending []schema.Block // tool_use blocks awaiting their results
	task    string
}

func newGenerator(seed int64, conv string, size Size, base int64) *generator {
	h := fnv.New64a()
	h.Write([]byte(conv))
	rng := rand.New(rand.NewPCG(uint64(seed), h.Sum64()))
	return &generator{rng: rng, conv: conv, scale: size.scale(), ts: base + int64(rng.IntN(60_000))}
}

func (g *generator) id() string {
	var u uuid.UUID
	for i := range u {
		u[i] = byte(g.rng.Uint32())
	}
	u[6] = u[6]&0x0f | 0x40 // version 4
	u[8] = u[8]&0x3f | 0x80 // RFC 4122 variant
	return u.String()
}

// between returns a size in [lo, hi) bytes, scaled.
func (g *generator) between(lo, hi int) int {
	l, h := int(float64(lo)*g.scale), int(float64(hi)*g.scale)
	if h <= l {
		return l + 1
	}
	return l + g.rng.IntN(h-l)
}

func (g *generator) next(last bool) schema.Turn {
	t := schema.Turn{ID: g.id(), ConversationID: g.conv}
	switch {
	case g.n == 0:
		g.ts += 1000
		t.Role = schema.RoleUser
		t.Content = schema.TextContent(g.request())
	case g.n%2 == 1:
		g.ts += 1000 + int64(g.rng.IntN(29_000)) // the model thinks
		t.Role = schema.RoleAssistant
		t.Content = g.assistant(last)
	default:
		g.ts += 100 + int64(g.rng.IntN(9_900)) // the tools run
		t.Role = schema.RoleUser
		t.Content = g.results()
	}
	t.TS = g.ts
	g.n++
	return t
}

func (g *generator) request() string {
	g.task = pick(g.rng, tasks)
	var b strings.Builder
	b.WriteString(g.task)
	target := g.between(100, 600)
	for b.Len() < target {
		b.WriteString(" ")
		b.WriteString(pick(g.rng, requestDetails))
	}
	return b.String()
}

func (g *generator) assistant(last bool) schema.Content {
	if last {
		return schema.TextContent(g.prose("Done. ", g.between(200, 900)))
	}
	var blocks []schema.Block
	if g.rng.Float64() < 0.3 {
		blocks = append(blocks, schema.Block{Type: schema.BlockReasoning, Text: g.prose("", g.between(100, 800))})
	}
	if g.rng.Float64() < 0.6 {
		blocks = append(blocks, schema.Block{Type: schema.BlockText, Text: g.prose("", g.between(50, 400))})
	}
	calls := 1
	if g.rng.Float64() < 0.15 {
		calls = 2
	}
	for range calls {
		name, input := g.toolCall()
		b := schema.Block{Type: schema.BlockToolUse, ID: "toolu_" + strings.ReplaceAll(g.id(), "-", "")[:24], Name: name, Input: input}
		blocks = append(blocks, b)
		g.pending = append(g.pending, b)
	}
	return schema.BlockContent(blocks...)
}

func (g *generator) results() schema.Content {
	var blocks []schema.Block
	for _, call := range g.pending {
		isErr := g.rng.Float64() < 0.07
		out := g.output(call.Name, isErr, g.between(200, 8192))
		c := schema.TextContent(out)
		blocks = append(blocks, schema.Block{Type: schema.BlockToolResult, ToolUseID: call.ID, Content: &c, IsError: isErr})
	}
	g.pending = g.pending[:0]
	if len(blocks) == 0 || g.rng.Float64() < 0.05 {
		blocks = append(blocks, schema.Block{Type: schema.BlockText, Text: pick(g.rng, followUps)})
	}
	return schema.BlockContent(blocks...)
}

// Tool inputs are encoded from structs, so their key order is fixed.
type (
	bashInput struct {
		Command string `json:"command"`
		Timeout int    `json:"timeout,omitempty"`
	}
	readInput struct {
		Path      string `json:"path"`
		StartLine int    `json:"start_line,omitempty"`
		EndLine   int    `json:"end_line,omitempty"`
	}
	editInput struct {
		Path      string `json:"path"`
		OldString string `json:"old_string"`
		NewString string `json:"new_string"`
	}
	grepInput struct {
		Pattern string `json:"pattern"`
		Path    string `json:"path"`
		Glob    string `json:"glob,omitempty"`
	}
)

func (g *generator) toolCall() (string, json.RawMessage) {
	var (
		name string
		v    any
	)
	switch r := g.rng.IntN(10); {
	case r < 4:
		name, v = "bash", bashInput{Command: pick(g.rng, shellCommands), Timeout: 120 * g.rng.IntN(2)}
	case r < 7:
		start := 1 + g.rng.IntN(300)
		name, v = "read_file", readInput{Path: g.path(), StartLine: start, EndLine: start + 40 + g.rng.IntN(160)}
	case r < 9:
		name, v = "edit_file", editInput{Path: g.path(), OldString: g.code(g.between(60, 400)), NewString: g.code(g.between(60, 500))}
	default:
		name, v = "grep", grepInput{Pattern: pick(g.rng, idents) + `\(`, Path: ".", Glob: "*.go"}
	}
	b, _ := schema.Marshal(v)
	return name, b
}

func (g *generator) path() string {
	return pick(g.rng, dirs) + "/" + pick(g.rng, idents) + pick(g.rng, []string{".go", "_test.go", ".py", ".ts"})
}

func (g *generator) output(tool string, isErr bool, size int) string {
	var b strings.Builder
	if isErr {
		b.WriteString(pick(g.rng, errorHeads))
		b.WriteString("\n")
	}
	for b.Len() < size {
		switch tool {
		case "bash":
			if g.rng.IntN(3) == 0 {
				fmt.Fprintf(&b, "--- %s: Test%s%s (%d.%02ds)\n", pick(g.rng, []string{"PASS", "PASS", "PASS", "FAIL"}),
					title(pick(g.rng, idents)), title(pick(g.rng, idents)), g.rng.IntN(3), g.rng.IntN(100))
			} else {
				fmt.Fprintf(&b, "2025-06-15T10:%02d:%02d.%03dZ %s %s %s=%d %s=%q\n", g.rng.IntN(60), g.rng.IntN(60), g.rng.IntN(1000),
					pick(g.rng, []string{"INFO", "DEBUG", "WARN", "ERROR"}), pick(g.rng, logMsgs),
					pick(g.rng, idents), g.rng.IntN(100000), pick(g.rng, idents), g.path())
			}
		case "grep":
			fmt.Fprintf(&b, "%s:%d:\t%s\n", g.path(), 1+g.rng.IntN(900), g.codeLine())
		default:
			fmt.Fprintf(&b, "%5d\t%s\n", 1+b.Len()/40, g.codeLine())
		}
	}
	return b.String()[:size]
}

func (g *generator) code(size int) string {
	var b strings.Builder
	for b.Len() < size {
		b.WriteString(g.codeLine())
		b.WriteString("\n")
	}
	return b.String()
}

func (g *generator) codeLine() string {
	a, c, d := pick(g.rng, idents), pick(g.rng, idents), pick(g.rng, idents)
	switch g.rng.IntN(7) {
	case 0:
		return fmt.Sprintf("func (s *%s) %s(ctx context.Context, %s string) error {", title(a), title(c), d)
	case 1:
		return fmt.Sprintf("\tif err := %s.%s(ctx); err != nil {", a, title(c))
	case 2:
		return fmt.Sprintf("\t\treturn fmt.Errorf(\"%s %s: %%w\", err)", a, c)
	case 3:
		return fmt.Sprintf("\t%s := make(map[string]%s, len(%s))", a, c, d)
	case 4:
		return fmt.Sprintf("\tfor _, %s := range %s.%s {", a[:1], c, title(d))
	case 5:
		return fmt.Sprintf("\t// %s", g.prose("", 40+g.rng.IntN(50)))
	}
	return "\t}"
}

func (g *generator) prose(prefix string, size int) string {
	var b strings.Builder
	b.WriteString(prefix)
	for b.Len() < size {
		b.WriteString(pick(g.rng, sentences))
		b.WriteString(" ")
	}
	return strings.TrimSpace(b.String())
}

func pick[T any](r *rand.Rand, xs []T) T { return xs[r.IntN(len(xs))] }

func title(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

var (
	tasks = []string{
		"The condense step drops the tool_result that pairs with the last kept tool_use; fix it and add a test.",
		"Add a --dry-run flag to the migrate command that prints the SQL it would run.",
		"Our CI fails on TestRelayRetries with a data race; find and fix the race.",
		"Refactor the token counter so the per-message cache survives a profile change.",
		"Implement pagination for the history endpoint, 100 messages per page by default.",
		"The service leaks goroutines on shutdown when a fetch is in flight. Please investigate.",
		"Write a benchmark for the truncation path with 10k messages and report allocations.",
		"Port the retry helper from the old client to the new jetstream package.",
	}
	requestDetails = []string{
		"Keep the public API unchanged.", "Run the whole test suite before you finish.",
		"The relevant code is under internal/ and pipeline/.", "Do not add new dependencies.",
		"Please explain the root cause briefly when you are done.", "Logs from the failing run are in ci.log.",
		"It reproduces about one time in five with -count=20.", "Follow the error wrapping style of the package.",
	}
	followUps = []string{
		"Also make sure the change works with the SQLite WAL mode.", "Please keep the commit small.",
		"Note: the staging server runs with -race, so check that too.", "Stop after the fix; do not refactor further.",
	}
	sentences = []string{
		"Let me look at how the consumer acknowledges messages.", "The failure comes from the order of the deferred calls.",
		"I will check the test that covers this path first.", "This function is called once per input, in the lane.",
		"The cache key does not include the profile id, which explains the stale counts.",
		"Next I need to run the package tests to confirm the fix.", "The summary message must keep the tool pairs intact.",
		"That matches the stack trace in the log.", "I updated the call site and the two tests that use it.",
		"The race is between the relay goroutine and the shutdown path.",
	}
	idents = []string{
		"conversation", "message", "summary", "window", "budget", "stream", "consumer", "lane", "profile",
		"counter", "outbox", "relay", "history", "marker", "threshold", "request", "handler", "config", "cache",
		"store", "tx", "batch", "cursor", "event", "input", "token", "split", "tail", "head", "result",
	}
	dirs          = []string{"pipeline", "store", "stages", "internal/natstest", "cmd/consumer", "llm", "schema", "tokens"}
	shellCommands = []string{
		"go test ./... 2>&1 | tail -50", "go test -race -run TestRelay ./store/", "go vet ./...",
		"git diff --stat", "ls -la internal/", "grep -rn 'Nak(' --include=*.go .", "go build ./... && echo ok",
		"sqlite3 data/ctx.db '.schema messages'", "cat ci.log | tail -80",
	}
	logMsgs = []string{
		"fetched batch", "committed input", "acked message", "condense started", "condense finished",
		"relay published event", "lane idle", "profile reloaded", "retrying after busy", "heartbeat sent",
	}
	errorHeads = []string{
		"exit status 1", "FAIL\tgithub.com/ctxpipe/ctxpipe/store\t0.412s", "panic: runtime error: index out of range [3] with length 3",
		"error: no such file or directory", "WARNING: DATA RACE",
	}
)
