package quality

import (
	"slices"
	"sort"
)

// Figure is a statistic over the reductions that have something to measure
// (a hidden span with paths in it, say); N is how many did, and Value means
// nothing when N is 0.
type Figure struct {
	Value float64 `json:"value"`
	N     int     `json:"n"`
}

// Stats is one row of the table: a strategy over every transcript.
type Stats struct {
	Row         string `json:"row"`
	Transcripts int    `json:"transcripts"`
	Turns       int    `json:"turns"`
	Rejected    int    `json:"rejected"`
	Reductions  int    `json:"reductions"`
	// ReductionsPer100Turns is Reductions per 100 turns replayed.
	ReductionsPer100Turns float64 `json:"reductions_per_100_turns"`
	// Median context tokens before and after a reduction, and the median of
	// each reduction's share of the context removed.
	TokensBefore Figure `json:"tokens_before"`
	TokensAfter  Figure `json:"tokens_after"`
	ReductionPct Figure `json:"reduction_pct"`
	// NotShrunk counts reductions after which the context was not smaller.
	NotShrunk                   int     `json:"not_shrunk"`
	SummarizerCalls             int     `json:"summarizer_calls"`
	SummarizerTokens            int     `json:"summarizer_tokens"`
	SummarizerTokensPer100Turns float64 `json:"summarizer_tokens_per_100_turns"`
	// Median retention per reduction, over reductions whose hidden span had
	// facts of that kind.
	FilesKept    Figure `json:"files_kept"`
	PathsKept    Figure `json:"paths_kept"`
	ErrorsKept   Figure `json:"errors_kept"`
	CommandsKept Figure `json:"commands_kept"`
	// Pooled retention: the facts kept over the facts hidden, summed over
	// every reduction, so a reduction that hid many weighs as many. A
	// median of 100 % can hide a long span that lost some.
	FilesKeptPooled    Figure `json:"files_kept_pooled"`
	PathsKeptPooled    Figure `json:"paths_kept_pooled"`
	ErrorsKeptPooled   Figure `json:"errors_kept_pooled"`
	CommandsKeptPooled Figure `json:"commands_kept_pooled"`
	// Shares of reductions: the last error kept (of those whose span had
	// an error), the task and the latest instruction kept verbatim.
	LastErrorKept  Figure `json:"last_error_kept"`
	TaskVerbatim   Figure `json:"task_verbatim"`
	LatestVerbatim Figure `json:"latest_verbatim"`
	// ToolResultsMissing counts tool calls, over every run, whose result
	// the effective history lost at some turn.
	ToolResultsMissing int `json:"tool_results_missing"`
	// Events counts every event type the runs emitted.
	Events map[string]int `json:"events"`
}

// Summarize folds one row's runs into its Stats.
func Summarize(row string, runs []Run) Stats {
	s := Stats{Row: row, Transcripts: len(runs), Events: map[string]int{}}
	var before, after, pct, files, paths, errs, cmds []float64
	var fileCounts, pathCounts, errCounts, cmdCounts []Count
	var lastErr, task, latest []bool
	for _, r := range runs {
		s.Turns += r.Turns
		s.Rejected += r.Rejected
		s.SummarizerCalls += r.SummarizerCalls
		s.SummarizerTokens += r.SummarizerTokens
		s.ToolResultsMissing += len(r.MissingToolResults)
		for k, v := range r.Events {
			s.Events[k] += v
		}
		for _, red := range r.Reductions {
			s.Reductions++
			if !red.Shrunk() {
				s.NotShrunk++
			}
			before = append(before, float64(red.TokensBefore))
			after = append(after, float64(red.TokensAfter))
			if red.TokensBefore > 0 {
				pct = append(pct, 100*float64(red.TokensBefore-red.TokensAfter)/float64(red.TokensBefore))
			}
			for _, c := range []struct {
				n      Count
				out    *[]float64
				counts *[]Count
			}{{red.Files, &files, &fileCounts}, {red.Paths, &paths, &pathCounts}, {red.Errors, &errs, &errCounts}, {red.Commands, &cmds, &cmdCounts}} {
				if v, ok := c.n.Share(); ok {
					*c.out = append(*c.out, v)
					*c.counts = append(*c.counts, c.n)
				}
			}
			if red.LastError != "" {
				lastErr = append(lastErr, red.LastErrorKept)
			}
			task = append(task, red.TaskVerbatim)
			latest = append(latest, red.LatestVerbatim)
		}
	}
	if s.Turns > 0 {
		s.ReductionsPer100Turns = 100 * float64(s.Reductions) / float64(s.Turns)
		s.SummarizerTokensPer100Turns = 100 * float64(s.SummarizerTokens) / float64(s.Turns)
	}
	s.TokensBefore, s.TokensAfter, s.ReductionPct = Median(before), Median(after), Median(pct)
	s.FilesKept, s.PathsKept, s.ErrorsKept, s.CommandsKept = Median(files), Median(paths), Median(errs), Median(cmds)
	s.FilesKeptPooled, s.PathsKeptPooled = Pooled(fileCounts), Pooled(pathCounts)
	s.ErrorsKeptPooled, s.CommandsKeptPooled = Pooled(errCounts), Pooled(cmdCounts)
	s.LastErrorKept, s.TaskVerbatim, s.LatestVerbatim = ShareTrue(lastErr), ShareTrue(task), ShareTrue(latest)
	return s
}

// Median is the middle value (the mean of the two middle ones for an even
// count).
func Median(v []float64) Figure {
	if len(v) == 0 {
		return Figure{}
	}
	v = slices.Clone(v)
	sort.Float64s(v)
	m := len(v) / 2
	if len(v)%2 == 1 {
		return Figure{Value: v[m], N: len(v)}
	}
	return Figure{Value: (v[m-1] + v[m]) / 2, N: len(v)}
}

// Pooled is the share kept of every fact the counts hold together; N is
// how many counts (reductions) held any.
func Pooled(counts []Count) Figure {
	var f Figure
	total, kept := 0, 0
	for _, c := range counts {
		if c.Total > 0 {
			f.N++
			total += c.Total
			kept += c.Kept
		}
	}
	if total > 0 {
		f.Value = float64(kept) / float64(total)
	}
	return f
}

// ShareTrue is the share of true values.
func ShareTrue(v []bool) Figure {
	if len(v) == 0 {
		return Figure{}
	}
	n := 0
	for _, b := range v {
		if b {
			n++
		}
	}
	return Figure{Value: float64(n) / float64(len(v)), N: len(v)}
}
