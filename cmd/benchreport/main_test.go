package main

import (
	"strings"
	"testing"
)

// Two runs' output, as make bench prints it (a log line of a benchmark
// included).
const sample = `goos: linux
cpu: Test CPU 9000
BenchmarkPipelineVsRaw-2   	       3	1148936079 ns/op	      7850 pipeline-turns/s	         0.08474 pipeline/raw	     92637 raw-turns/s
BenchmarkPipelineVsRaw-2   	       3	1148936079 ns/op	      8600 pipeline-turns/s	         0.09 pipeline/raw	     95000 raw-turns/s
BenchmarkEndToEnd-2   	       1	21113700323 ns/op	       731.0 agent-turns/s	     20281 bare-e2e-turns/s	      3216 bytes/read	      4124 e2e-turns/s	       210.0 full-agent-turns/s	    123846 full-bytes/read	       104.6 full-p50-ms	       275.8 full-p99-ms	        27.62 p50-ms	        82.80 p99-ms	      5235 publish-turns/s
BenchmarkServiceRSS/held=256MiB-2         	       1	21794090861 ns/op	       256.0 held-bound-MiB	       512.0 memory-limit-MiB	       579.3 peak-RSS-MiB	         1.101 turns/s
BenchmarkServiceRSS/held=64MiB-2          	       1	16127566584 ns/op	        64.00 held-bound-MiB	       320.0 memory-limit-MiB	       404.6 peak-RSS-MiB	         1.488 turns/s
BenchmarkProxyLatency-2   	       1	14304240540 ns/op	        14.84 added-p50-ms	       152.3 added-p99-ms	         0.5696 direct-p50-ms	        23.03 direct-p99-ms	        15.93 proxy-p50-ms	       171.6 proxy-p99-ms	       366.0 requests
BenchmarkProxyReplay-2   	       1	115974046574 ns/op	        86.00 after-reduction	         0 after-reduction-kept	         0 prefix-broken	       100.0 prefix-kept-%	        86.00 reductions	      3850 requests	        33.34 requests/s	        43.00 transcripts	        38.79 upstream-bytes-%	        39.36 upstream-tokens-%
BenchmarkHistoryLength-2 log line without a count
PASS
`

func TestTable(t *testing.T) {
	res, cpu, err := parse(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	if cpu != "Test CPU 9000" {
		t.Fatalf("cpu %q", cpu)
	}
	got := table(res, cpu, 2)
	for _, want := range []string{
		"on 2 cores (Test CPU 9000)",
		"| 7,850–8,600 turns/s, 0.08–0.09 of raw (raw 92,637–95,000 turns/s) |",
		"| 4,124 turns/s end to end; the broker took them at 5,235 turns/s; the same command through JetStream alone (nothing but an ack): 20,281 turns/s |",
		"731 turns/s, p50 27.6 ms, p99 83 ms, 3,216 bytes per read; reading the whole history instead: 210 turns/s, p99 276 ms, 123,846 bytes per read",
		"579 MiB at the defaults (256 MiB held, memory limit 512 MiB); 405 MiB at 64 MiB held (limit 320 MiB)",
		"| added p50 14.8 ms, p99 152 ms over 366 requests (straight: p50 0.6 ms, p99 23 ms; through the proxy: p50 15.9 ms, p99 172 ms) |",
		"| 100.00 % between reductions, of 3,850 requests over 43 transcripts (86 came right after one of the 86 reductions, 0 of those extended the previous); upstream got 39.4 % of the tokens of every turn's full history (38.8 % of the bytes) |",
		"| n/a× |", // HistoryLength: its only line is not a result
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
}

func TestReplace(t *testing.T) {
	readme := "# x\n\n" + startMarker + "\nold table\n" + endMarker + "\nafter\n"
	out, err := replace([]byte(readme), "new table\n")
	if err != nil {
		t.Fatal(err)
	}
	want := "# x\n\n" + startMarker + "\nnew table\n" + endMarker + "\nafter\n"
	if string(out) != want {
		t.Fatalf("got %q, want %q", out, want)
	}
	if _, err := replace([]byte("no markers"), "t"); err == nil {
		t.Fatal("a README without markers was accepted")
	}
}
