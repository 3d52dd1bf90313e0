// Command quality replays the shared real agent runs through the context
// engine, one row per strategy, and prints what each reduction kept: how
// often it reduces, by how much, what it sends the summarizer, and the share
// of the files the hidden tool calls touched, of the hidden file paths,
// error lines and commands (each at the median per reduction and pooled
// over all of them), of the task and the latest instruction still in the
// effective history afterwards.
//
//	go run ./cmd/quality [--transcripts DIR] [--window N] [--threshold P]
//	    [--jobs N] [--format text|markdown] [--json] [--base-url URL --model M]
//
// It condenses with the offline extractive condenser unless an endpoint is
// given by flag or by CTXPIPE_LLM_* (see condense.ConfigFromEnv).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/ctxpipe/ctxpipe/condense"
	"github.com/ctxpipe/ctxpipe/internal/quality"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// report is the --json document.
type report struct {
	Window      int             `json:"window"`
	Threshold   int             `json:"threshold"`
	Condenser   string          `json:"condenser"`
	Transcripts int             `json:"transcripts"`
	Seconds     float64         `json:"seconds"`
	Rows        []quality.Stats `json:"rows"`
	// Runs holds every run with its reductions, with --json --detail.
	Runs [][]quality.Run `json:"runs,omitempty"`
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("quality", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("transcripts", "../shared/data/transcripts", "directory of the agent runs (*.jsonl and *.system.txt)")
	window := fs.Int("window", 32000, "context window of the profile, in tokens")
	threshold := fs.Int("threshold", 70, "condense threshold of the profile, in percent of the window")
	jobs := fs.Int("jobs", runtime.GOMAXPROCS(0), "transcripts replayed at once")
	format := fs.String("format", "text", "table format: text or markdown")
	asJSON := fs.Bool("json", false, "print the figures as JSON instead of a table")
	detail := fs.Bool("detail", false, "with --json, add every run and reduction")
	baseURL := fs.String("base-url", "", "OpenAI-compatible endpoint for the summarizer (default $"+condense.EnvBaseURL+")")
	model := fs.String("model", "", "summarizer model (default $"+condense.EnvModel+")")
	quiet := fs.Bool("quiet", false, "no progress on stderr")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *format != "text" && *format != "markdown" {
		fmt.Fprintf(stderr, "quality: --format must be text or markdown, not %q\n", *format)
		return 2
	}
	cfg := condense.ConfigFromEnv()
	if *baseURL != "" {
		cfg.BaseURL = *baseURL
	}
	if *model != "" {
		cfg.Model = *model
	}
	base := quality.BaseProfile(*window, *threshold)
	if err := base.Validate(); err != nil {
		fmt.Fprintf(stderr, "quality: %v\n", err)
		return 2
	}
	condenser := condense.OfflineModel
	if cfg.Configured(base) {
		ep := cfg.Endpoint(base)
		condenser = ep.Model + " at " + ep.BaseURL
	}

	ts, err := quality.Load(*dir)
	if err != nil {
		fmt.Fprintf(stderr, "quality: %v\n", err)
		return 1
	}
	rows := quality.Rows()
	start := time.Now()
	var progress quality.Progress
	if !*quiet {
		progress = func(r quality.Run, done, total int) {
			fmt.Fprintf(stderr, "[%3d/%d] %-19s %-58s %4d turns %3d reductions %s\n",
				done, total, r.Row, r.Transcript, r.Turns, len(r.Reductions), time.Since(start).Round(100*time.Millisecond))
		}
	}
	runs, err := quality.ReplayAll(ctx, ts, rows, base, condense.NewRouter(cfg, nil), *jobs, progress)
	if err != nil {
		fmt.Fprintf(stderr, "quality: %v\n", err)
		if errors.Is(err, context.Canceled) {
			return 130
		}
		return 1
	}
	rep := report{Window: *window, Threshold: *threshold, Condenser: condenser, Transcripts: len(ts), Seconds: time.Since(start).Seconds()}
	for i, row := range rows {
		rep.Rows = append(rep.Rows, quality.Summarize(row.Name, runs[i]))
	}
	if !*quiet {
		fmt.Fprintf(stderr, "replayed %d transcripts × %d strategies in %s\n", len(ts), len(rows), time.Since(start).Round(100*time.Millisecond))
	}
	if *asJSON {
		if *detail {
			rep.Runs = runs
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			fmt.Fprintf(stderr, "quality: %v\n", err)
			return 1
		}
		return 0
	}
	printTable(stdout, rep, *format == "markdown")
	return 0
}

// columns are the table's headings; cells gives one row's values in order.
var columns = []string{
	"strategy", "reductions /100 turns", "context before → after", "reduction",
	"summarizer tokens /100 turns", "files touched kept", "paths kept", "error lines kept", "last error kept",
	"commands kept", "task verbatim", "latest instruction verbatim", "tool results missing",
}

func cells(s quality.Stats) []string {
	return []string{
		s.Row,
		fmt.Sprintf("%.1f", s.ReductionsPer100Turns),
		tokenCount(s.TokensBefore) + " → " + tokenCount(s.TokensAfter),
		pct(s.ReductionPct.Value/100, s.ReductionPct.N),
		thousands(int(s.SummarizerTokensPer100Turns + 0.5)),
		medianPooled(s.FilesKept, s.FilesKeptPooled),
		medianPooled(s.PathsKept, s.PathsKeptPooled),
		medianPooled(s.ErrorsKept, s.ErrorsKeptPooled),
		pct(s.LastErrorKept.Value, s.LastErrorKept.N),
		medianPooled(s.CommandsKept, s.CommandsKeptPooled),
		pct(s.TaskVerbatim.Value, s.TaskVerbatim.N),
		pct(s.LatestVerbatim.Value, s.LatestVerbatim.N),
		fmt.Sprint(s.ToolResultsMissing),
	}
}

func printTable(w io.Writer, rep report, markdown bool) {
	turns := 0
	if len(rep.Rows) > 0 {
		turns = rep.Rows[0].Turns
	}
	fmt.Fprintf(w, "%d transcripts, %s turns; %s-token window, threshold %d %%, condenser %s.\n",
		rep.Transcripts, thousands(turns), thousands(rep.Window), rep.Threshold, rep.Condenser)
	fmt.Fprintf(w, "Token figures are medians per reduction; retention is the median per reduction / pooled over all\n"+
		"reductions (kept of all hidden); shares are of reductions. Files touched: named by the span's tool inputs.\n\n")
	if markdown {
		fmt.Fprintf(w, "| %s |\n", strings.Join(columns, " | "))
		fmt.Fprintf(w, "|---|%s\n", strings.Repeat("---:|", len(columns)-1))
		for _, s := range rep.Rows {
			fmt.Fprintf(w, "| %s |\n", strings.Join(cells(s), " | "))
		}
	} else {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, strings.Join(columns, "\t"))
		for _, s := range rep.Rows {
			fmt.Fprintln(tw, strings.Join(cells(s), "\t"))
		}
		tw.Flush()
	}
	for _, s := range rep.Rows {
		if s.NotShrunk > 0 || s.Rejected > 0 {
			fmt.Fprintf(w, "\n%s: %d reductions did not shrink the context; %d turns rejected by the engine.", s.Row, s.NotShrunk, s.Rejected)
		}
		if n := s.Events["condense_failed"]; n > 0 {
			fmt.Fprintf(w, "\n%s: %d condenses failed (%d truncations).", s.Row, n, s.Events["sliding_window_truncation"])
		}
	}
	fmt.Fprintln(w)
}

// medianPooled is a retention cell: the median per reduction, then the
// pooled share.
func medianPooled(median, pooled quality.Figure) string {
	if median.N == 0 {
		return "–"
	}
	return pct(median.Value, median.N) + " / " + pct(pooled.Value, pooled.N)
}

// pct is a share in whole percent, but never rounded up to 100 %: a
// share short of all shows one decimal (99.8 %).
func pct(v float64, n int) string {
	if n == 0 {
		return "–"
	}
	if s := fmt.Sprintf("%.0f %%", 100*v); s != "100 %" || v >= 1 {
		return s
	}
	return fmt.Sprintf("%.1f %%", math.Min(100*v, 99.9))
}

func tokenCount(f quality.Figure) string {
	if f.N == 0 {
		return "–"
	}
	return thousands(int(f.Value + 0.5))
}

// thousands writes n with comma separators, as the README does.
func thousands(n int) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return "-" + thousands(-n)
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
