// Command benchreport turns what `make bench` printed into the README's
// performance table: each figure beside its anchor from the same run, and
// the machine it ran on. Given the output of several runs, it prints each
// figure's range.
//
//	make bench 2>&1 | tee bench.out
//	go run ./cmd/benchreport [--readme README.md] < bench.out
//
// With --readme it replaces the table between the file's bench markers;
// otherwise it prints the table.
package main

import (
	"bufio"
	"bytes"
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"strings"
)

// The README's generated section lies between these lines.
const (
	startMarker = "<!-- bench:start (go run ./cmd/benchreport --readme README.md < bench.out) -->"
	endMarker   = "<!-- bench:end -->"
)

// results are the figures of a bench run: benchmark → unit → every value
// reported (one per run of the output).
type results map[string]map[string][]float64

// parse reads `go test -bench` output: result lines and the cpu line.
func parse(r io.Reader) (results, string, error) {
	res := results{}
	cpu := ""
	suffix := regexp.MustCompile(`-\d+$`)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "cpu: "); ok {
			cpu = strings.TrimSpace(v)
			continue
		}
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue // a benchmark's log line, not its result
		}
		name := suffix.ReplaceAllString(f[0], "")
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return nil, "", fmt.Errorf("%s: value %q: %w", name, f[i], err)
			}
			if res[name] == nil {
				res[name] = map[string][]float64{}
			}
			res[name][f[i+1]] = append(res[name][f[i+1]], v)
		}
	}
	return res, cpu, sc.Err()
}

// span formats a figure's values as "v" or "min–max" with format.
func (r results) span(bench, unit, format string) string {
	vs := r[bench][unit]
	if len(vs) == 0 {
		return "n/a"
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, v := range vs {
		lo, hi = min(lo, v), max(hi, v)
	}
	a, b := num(format, lo), num(format, hi)
	if a == b {
		return a
	}
	return a + "–" + b
}

// num formats v: "int" with thousands separators, else a Sprintf format.
func num(format string, v float64) string {
	if format != "int" {
		return fmt.Sprintf(format, v)
	}
	s := strconv.FormatInt(int64(math.Round(v)), 10)
	var out []byte
	for i := range s {
		if i > 0 && (len(s)-i)%3 == 0 && s[i-1] != '-' {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}

// row is one line of the table.
type row struct {
	what, command string
	figure        func(results) string
}

var rows = []row{
	{"pipeline vs raw consume+ack, same run (goal ≥ 0.20)",
		"go test -run '^$' -bench PipelineVsRaw -benchtime 3x ./pipeline/",
		func(r results) string {
			return fmt.Sprintf("%s turns/s, %s of raw (raw %s turns/s)",
				r.span("BenchmarkPipelineVsRaw", "pipeline-turns/s", "int"), r.span("BenchmarkPipelineVsRaw", "pipeline/raw", "%.2f"),
				r.span("BenchmarkPipelineVsRaw", "raw-turns/s", "int"))
		}},
	{"50 conversations × 200 small turns, end to end over TCP (goal 20k/s)",
		"`bin/publisher load --convs 50 --turns 200 --size small --wait`; `-bench EndToEnd ./cmd/publisher/`",
		func(r results) string {
			return fmt.Sprintf("%s turns/s end to end; the broker took them at %s turns/s; the same command through JetStream alone (nothing but an ack): %s turns/s",
				r.span("BenchmarkEndToEnd", "e2e-turns/s", "int"), r.span("BenchmarkEndToEnd", "publish-turns/s", "int"),
				r.span("BenchmarkEndToEnd", "bare-e2e-turns/s", "int"))
		}},
	{"an agent reading after every turn, incremental (`after`), 24 agents (goal 1,000/s, p99 < 10 ms)",
		"`bin/publisher load --agent --convs 24 --turns 100 --rate 1000`; `-bench EndToEnd ./cmd/publisher/`",
		func(r results) string {
			const b = "BenchmarkEndToEnd"
			return fmt.Sprintf("%s turns/s, p50 %s ms, p99 %s ms, %s bytes per read; reading the whole history instead: %s turns/s, p99 %s ms, %s bytes per read",
				r.span(b, "agent-turns/s", "int"), r.span(b, "p50-ms", "%.1f"), r.span(b, "p99-ms", "%.0f"), r.span(b, "bytes/read", "int"),
				r.span(b, "full-agent-turns/s", "int"), r.span(b, "full-p99-ms", "%.0f"), r.span(b, "full-bytes/read", "int"))
		}},
	{"others' p99 publish→readable while one conversation's LLM stalls 30 s (goal ≤ 2×)",
		"go test -run '^$' -bench StalledConversation ./pipeline/",
		func(r results) string {
			return fmt.Sprintf("%s× of the unstalled p99", r.span("BenchmarkStalledConversation", "stalled/unstalled", "%.2f"))
		}},
	{"per turn at 10,000 vs 10 stored messages (goal ≤ 1.2×)",
		"go test -run '^$' -bench HistoryLength -benchtime 300x ./pipeline/",
		func(r results) string {
			return r.span("BenchmarkHistoryLength", "10k/10", "%.2f") + "×"
		}},
	{"the service's own peak RSS, 24 turns of 4 MiB (goal: bounded by configuration)",
		"go test -run '^$' -bench ServiceRSS -benchtime 1x ./cmd/consumer/",
		func(r results) string {
			const b = "BenchmarkServiceRSS/held=%dMiB"
			return fmt.Sprintf("%s MiB at the defaults (%s MiB held, memory limit %s MiB); %s MiB at %s MiB held (limit %s MiB)",
				r.span(fmt.Sprintf(b, 256), "peak-RSS-MiB", "%.0f"), r.span(fmt.Sprintf(b, 256), "held-bound-MiB", "%.0f"),
				r.span(fmt.Sprintf(b, 256), "memory-limit-MiB", "%.0f"),
				r.span(fmt.Sprintf(b, 64), "peak-RSS-MiB", "%.0f"), r.span(fmt.Sprintf(b, 64), "held-bound-MiB", "%.0f"),
				r.span(fmt.Sprintf(b, 64), "memory-limit-MiB", "%.0f"))
		}},
	{"decoding the 7.7k real turns",
		"go test -run '^$' -bench DecodeTranscripts ./schema/",
		func(r results) string { return r.span("BenchmarkDecodeTranscripts", "MB/s", "%.0f") + " MB/s" }},
	{"rebuilding a SQLite file from `CTX_STATE` (goal ≥ 50,000 changes/s)",
		"go test -run '^$' -bench Rebuild -benchtime 3x ./pipeline/",
		func(r results) string {
			return fmt.Sprintf("%s changes/s (best iteration %s)",
				r.span("BenchmarkRebuild", "changes/s", "int"), r.span("BenchmarkRebuild", "best-changes/s", "int"))
		}},
	{"the proxy's added latency per request, sampled agent loops sent straight to the upstream and through the proxy",
		"go test -run '^$' -bench ProxyLatency -benchtime 1x ./proxy/",
		func(r results) string {
			const b = "BenchmarkProxyLatency"
			return fmt.Sprintf("added p50 %s ms, p99 %s ms over %s requests (straight: p50 %s ms, p99 %s ms; through the proxy: p50 %s ms, p99 %s ms)",
				r.span(b, "added-p50-ms", "%.1f"), r.span(b, "added-p99-ms", "%.0f"), r.span(b, "requests", "int"),
				r.span(b, "direct-p50-ms", "%.1f"), r.span(b, "direct-p99-ms", "%.0f"),
				r.span(b, "proxy-p50-ms", "%.1f"), r.span(b, "proxy-p99-ms", "%.0f"))
		}},
	{"the shared transcripts replayed as agent loops through the proxy, 32k window: upstream requests extending the previous one byte for byte between reductions (goal ≥ 99 %), and the tokens sent upstream",
		"go test -run '^$' -bench ProxyReplay -benchtime 1x ./proxy/",
		func(r results) string {
			const b = "BenchmarkProxyReplay"
			return fmt.Sprintf("%s %% between reductions, of %s requests over %s transcripts (%s came right after one of the %s reductions, %s of those extended the previous); upstream got %s %% of the tokens of every turn's full history (%s %% of the bytes)",
				r.span(b, "prefix-kept-%", "%.2f"), r.span(b, "requests", "int"), r.span(b, "transcripts", "int"),
				r.span(b, "after-reduction", "int"), r.span(b, "reductions", "int"), r.span(b, "after-reduction-kept", "int"),
				r.span(b, "upstream-tokens-%", "%.1f"), r.span(b, "upstream-bytes-%", "%.1f"))
		}},
}

// table is the markdown of the figures.
func table(r results, cpu string, cores int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Measured by `make bench` on %d cores (%s):\n\n", cores, cmp.Or(cpu, "cpu unknown"))
	b.WriteString("| what | command | figure |\n|---|---|---|\n")
	for _, rw := range rows {
		cmd := rw.command
		if !strings.HasPrefix(cmd, "`") {
			cmd = "`" + cmd + "`"
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", rw.what, cmd, rw.figure(r))
	}
	return b.String()
}

// replace puts section between the markers of readme.
func replace(readme []byte, section string) ([]byte, error) {
	i := bytes.Index(readme, []byte(startMarker))
	j := bytes.Index(readme, []byte(endMarker))
	if i < 0 || j < i {
		return nil, errors.New("no bench markers in the README")
	}
	var out bytes.Buffer
	out.Write(readme[:i+len(startMarker)])
	out.WriteString("\n" + section)
	out.Write(readme[j:])
	return out.Bytes(), nil
}

func main() {
	readme := flag.String("readme", "", "replace the table between this file's bench markers (default: print it)")
	flag.Parse()
	res, cpu, err := parse(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
	if len(res) == 0 {
		fmt.Fprintln(os.Stderr, "benchreport: no benchmark results on standard input (pipe `make bench` into it)")
		os.Exit(1)
	}
	section := table(res, cpu, runtime.NumCPU())
	if *readme == "" {
		fmt.Print(section)
		return
	}
	old, err := os.ReadFile(*readme)
	if err == nil {
		var out []byte
		if out, err = replace(old, section); err == nil {
			err = os.WriteFile(*readme, out, 0o644)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
}
