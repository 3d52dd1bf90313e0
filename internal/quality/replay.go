// Package quality measures what the context engine keeps when it reduces a
// conversation: it replays real agent runs through stages.Conversation under
// a profile per strategy and, at every reduction, compares the effective
// history before and after (see Measure). cmd/quality prints the table;
// `make quality` runs it.
package quality

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/ctxpipe/ctxpipe/condense"
	"github.com/ctxpipe/ctxpipe/engine"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/tokens"
)

// Transcript is one recorded agent run: its turns and the system prompt the
// agent sent with them.
type Transcript struct {
	Name   string
	System string
	Turns  []schema.Turn
	// Bytes is the size of the JSONL file, to schedule long runs first.
	Bytes int64
}

// Load reads every <name>.jsonl under dir, with <name>.system.txt when
// present, sorted by name. (internal/transcripts serves the tests with the
// same files but fails a testing.TB instead of returning errors.)
func Load(dir string) ([]Transcript, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	if err != nil {
		return nil, fmt.Errorf("list transcripts in %s: %w", dir, err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no transcripts (*.jsonl) in %s", dir)
	}
	slices.Sort(files)
	out := make([]Transcript, 0, len(files))
	for _, f := range files {
		t, err := ReadTranscript(f)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

// ReadTranscript reads one transcript file and its system prompt.
func ReadTranscript(file string) (Transcript, error) {
	fh, err := os.Open(file)
	if err != nil {
		return Transcript{}, fmt.Errorf("open transcript: %w", err)
	}
	defer fh.Close()
	t := Transcript{Name: strings.TrimSuffix(filepath.Base(file), ".jsonl")}
	if st, err := fh.Stat(); err == nil {
		t.Bytes = st.Size()
	}
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for n := 1; sc.Scan(); n++ {
		var turn schema.Turn
		if err := json.Unmarshal(sc.Bytes(), &turn); err != nil {
			return Transcript{}, fmt.Errorf("%s line %d: %w", t.Name, n, err)
		}
		t.Turns = append(t.Turns, turn)
	}
	if err := sc.Err(); err != nil {
		return Transcript{}, fmt.Errorf("read %s: %w", t.Name, err)
	}
	sys, err := os.ReadFile(strings.TrimSuffix(file, ".jsonl") + ".system.txt")
	switch {
	case err == nil:
		t.System = string(sys)
	case !errors.Is(err, os.ErrNotExist):
		return Transcript{}, fmt.Errorf("read system prompt of %s: %w", t.Name, err)
	}
	return t, nil
}

// Row is one line of the table: a name and the reduction it configures on
// the base profile. A new reduction the engine learns (masking, masking then
// condensing) is one more Row whose Configure sets the profile fields for it.
type Row struct {
	Name      string
	Configure func(p *schema.Profile)
}

// Rows are the reductions the engine offers: the three condense strategies,
// observation masking alone (auto-condense off: masking, then truncation
// when the context is still over the allowed size), and masking first with
// keep_tail when masking was not enough.
func Rows() []Row {
	strategy := func(s schema.Strategy) func(*schema.Profile) {
		return func(p *schema.Profile) { p.Strategy = s }
	}
	off := false
	return []Row{
		{Name: "keep_tail", Configure: strategy(schema.StrategyKeepTail)},
		{Name: "fresh_start", Configure: strategy(schema.StrategyFreshStart)},
		{Name: "preserve_fraction", Configure: strategy(schema.StrategyPreserveFraction)},
		{Name: "mask only", Configure: func(p *schema.Profile) {
			p.Mask.Enabled, p.AutoCondense = true, &off
		}},
		{Name: "mask then keep_tail", Configure: func(p *schema.Profile) {
			p.Mask.Enabled, p.Strategy = true, schema.StrategyKeepTail
		}},
	}
}

// BaseProfile is the profile every row starts from: a window of the given
// size and a threshold in percent, the rest left to the engine's defaults
// (8,192 tokens reserved for the reply, the 1.5 fudge factor, o200k).
func BaseProfile(window, threshold int) schema.Profile {
	return schema.Profile{ID: fmt.Sprintf("quality-%dk", window/1000), ContextWindow: window, CondenseThreshold: &threshold}
}

// ReductionEvents are the event types that make the context smaller.
var ReductionEvents = map[schema.EventType]bool{
	schema.EventCondenseContext:         true,
	schema.EventSlidingWindowTruncation: true,
	schema.EventToolResultsMasked:       true,
}

// Run is one transcript replayed under one row.
type Run struct {
	Row        string `json:"row"`
	Transcript string `json:"transcript"`
	Turns      int    `json:"turns"`
	// Rejected counts turns the engine refused (an engine defect: every
	// transcript turn is valid).
	Rejected   int            `json:"rejected"`
	Events     map[string]int `json:"events"`
	Reductions []Reduction    `json:"reductions"`
	// SummarizerCalls and SummarizerTokens count every request sent to the
	// summarizer (failed condenses too): the o200k tokens of its prompt and
	// of each message as an OpenAI-compatible model receives it.
	SummarizerCalls  int `json:"summarizer_calls"`
	SummarizerTokens int `json:"summarizer_tokens"`
	// MissingToolResults are the tool calls whose pairing the effective
	// history broke at some turn (see BrokenToolPairs).
	MissingToolResults []string `json:"missing_tool_results,omitempty"`
}

// meter counts what is sent to a summarizer before passing the request on.
type meter struct {
	next          engine.Summarizer
	text          tokens.TextCounter
	calls, tokens int
}

func (m *meter) Summarize(ctx context.Context, req schema.SummaryRequest) (schema.Summary, error) {
	m.calls++
	m.tokens += RequestTokens(m.text, req)
	return m.next.Summarize(ctx, req)
}

// RequestTokens counts a summary request as the OpenAI summarizer sends it:
// the prompt and every message rendered by condense.RenderContent (without the
// few tokens of per-message framing, which no condenser controls).
func RequestTokens(tc tokens.TextCounter, req schema.SummaryRequest) int {
	n := tc.Count(req.Prompt)
	for i := range req.Messages {
		n += tc.Count(condense.RenderContent(req.Messages[i].Content))
	}
	return n
}

// Replay appends every turn of t to a new conversation under profile p,
// condensing with s, and measures each reduction. It fails only on a
// transient error or ctx; a turn the engine rejects is counted.
func Replay(ctx context.Context, t Transcript, row string, p schema.Profile, s engine.Summarizer) (Run, error) {
	tc, err := tokens.O200K()
	if err != nil {
		return Run{}, fmt.Errorf("o200k counter: %w", err)
	}
	m := &meter{next: s, text: tc}
	eng := engine.NewEngine(m)
	eng.Log = slog.New(slog.DiscardHandler) // an info line per condense would bury the progress
	conv := engine.NewConversation(t.Name, p, eng)
	run := Run{Row: row, Transcript: t.Name, Turns: len(t.Turns), Events: map[string]int{}, Reductions: []Reduction{}}
	broken := newSet()
	task, latest := "", ""
	for i, turn := range t.Turns {
		if err := ctx.Err(); err != nil {
			return run, fmt.Errorf("%s/%s turn %d: %w", row, t.Name, i, err)
		}
		if i == 0 && t.System != "" {
			turn.SystemPrompt = t.System
		}
		if turn.Role == schema.RoleUser {
			if text := UserText(turn.Content); strings.TrimSpace(text) != "" {
				if task == "" {
					task = text
				}
				latest = text
			}
		}
		prev := conv.Messages
		evs, err := conv.Append(ctx, turn)
		if err != nil {
			var se *schema.Error
			if errors.As(err, &se) {
				run.Rejected++
				continue
			}
			return run, fmt.Errorf("%s/%s turn %d: %w", row, t.Name, i, err)
		}
		var reductions []string
		for _, e := range evs {
			typ := e.Header().Type
			run.Events[string(typ)]++
			if ReductionEvents[typ] {
				reductions = append(reductions, string(typ))
			}
		}
		after := conv.Effective()
		for _, id := range BrokenToolPairs(conv.Messages, after) {
			broken.add(id)
		}
		if len(reductions) == 0 {
			continue
		}
		before := engine.EffectiveHistory(append(prev[:len(prev):len(prev)], untagged(conv.Messages, turn.ID)...))
		r := Measure(before, after, task, latest)
		r.Transcript, r.Turn, r.Events = t.Name, i, reductions
		r.TokensBefore = engine.ContextTokens(conv.State.SystemTokens, before)
		r.TokensAfter = engine.ContextTokens(conv.State.SystemTokens, after)
		run.Reductions = append(run.Reductions, r)
	}
	run.SummarizerCalls, run.SummarizerTokens = m.calls, m.tokens
	run.MissingToolResults = broken.list
	return run, nil
}

// untagged is the stored message with the given id as it was before the
// reduction hid it: its tags cleared.
func untagged(msgs []schema.Message, id string) []schema.Message {
	for i := range msgs {
		if msgs[i].ID == id {
			m := msgs[i]
			m.CondenseParent, m.TruncationParent = "", ""
			return []schema.Message{m}
		}
	}
	return nil
}

// Progress is told about each finished run: how many are done of how many.
type Progress func(r Run, done, total int)

// ReplayAll replays every transcript under every row, on jobs goroutines.
// The result is indexed [row][transcript] in the order given, whatever order
// the runs finish in, so the figures do not depend on scheduling. progress
// may be nil; it is called from one goroutine at a time.
func ReplayAll(ctx context.Context, ts []Transcript, rows []Row, base schema.Profile, s engine.Summarizer, jobs int, progress Progress) ([][]Run, error) {
	type job struct{ row, tr int }
	var work []job
	for r := range rows {
		for i := range ts {
			work = append(work, job{r, i})
		}
	}
	// Longest runs first, so that two workers finish together.
	slices.SortStableFunc(work, func(a, b job) int { return cmp.Compare(ts[b.tr].Bytes, ts[a.tr].Bytes) })
	out := make([][]Run, len(rows))
	for r := range out {
		out[r] = make([]Run, len(ts))
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan job)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		done int
	)
	for range max(jobs, 1) {
		wg.Go(func() {
			for j := range next {
				p := base
				rows[j.row].Configure(&p)
				run, err := Replay(ctx, ts[j.tr], rows[j.row].Name, p, s)
				if err != nil {
					cancel(err)
					continue
				}
				mu.Lock()
				out[j.row][j.tr] = run
				done++
				if progress != nil {
					progress(run, done, len(work))
				}
				mu.Unlock()
			}
		})
	}
feed:
	for _, j := range work {
		select {
		case next <- j:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
	return out, nil
}
