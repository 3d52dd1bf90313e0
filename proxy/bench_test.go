package proxy

import (
	"context"
	"net/http/httptest"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/client"
	"github.com/ctxpipe/ctxpipe/client/clienttest"
	"github.com/ctxpipe/ctxpipe/internal/quality"
	"github.com/ctxpipe/ctxpipe/schema"
)

// transcriptsDir holds the shared agent runs, beside the repository.
const transcriptsDir = "../../shared/data/transcripts"

// replayProfile is the profile the replays run under: make quality's 32k
// window at its 70 % threshold, so that the longer runs cross it several
// times (a 200k window would never be reached by these runs).
func replayProfile() schema.Profile {
	p := quality.BaseProfile(32000, 70)
	p.ID = schema.DefaultProfileID
	return p
}

// newReplayer is the real service on an embedded server, the proxy, and
// the replay upstream for ts.
func newReplayer(tb testing.TB, ts []quality.Transcript) *replayer {
	tb.Helper()
	svc := clienttest.New(tb, clienttest.WithProfiles(replayProfile()))
	c, err := client.Connect(bus.ConnConfig{URL: svc.URL})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	waitApplying(tb, c)
	m := newReplayModel(tb, ts)
	p := New(c, Config{
		OpenAI:    Upstream{BaseURL: m.srv.URL + "/v1"},
		Anthropic: Upstream{BaseURL: m.srv.URL},
		Secret:    []byte("bench secret"),
	})
	srv := httptest.NewServer(p)
	tb.Cleanup(srv.Close)
	return &replayer{c: c, proxy: srv.URL, model: m}
}

func loadTranscripts(tb testing.TB) []quality.Transcript {
	tb.Helper()
	ts, err := quality.Load(transcriptsDir)
	if err != nil {
		tb.Fatalf("%v (the benchmarks expect ../shared beside the repo)", err)
	}
	return ts
}

// latencySample is the deterministic sample of transcripts whose loops
// measure the proxy's added latency: the runs whose names sort at every
// eighth place (6 of the 43, some 600 requests).
func latencySample(ts []quality.Transcript) []quality.Transcript {
	var out []quality.Transcript
	for i := 0; i < len(ts); i += 8 {
		out = append(out, ts[i])
	}
	return out
}

// BenchmarkProxyLatency is the proxy's added latency per request: each
// request of the sampled agent loops is sent straight to the upstream and
// then, the same bytes, through the proxy (which records its new turns,
// waits until they are applied, reads the effective history and forwards
// it; the reply, every other one streamed, is recorded after it reached
// the client). Reported: the latency of both, and of the difference per
// request, at the median and the 99th percentile.
func BenchmarkProxyLatency(b *testing.B) {
	ts := latencySample(loadTranscripts(b))
	for range b.N {
		rp := newReplayer(b, ts)
		rp.direct, rp.stream = true, true
		var direct, proxied, added []float64
		for _, t := range ts {
			run, err := rp.run(context.Background(), t, "lat-"+convSafe(t.Name))
			if err != nil {
				b.Fatal(err)
			}
			for _, st := range run.steps {
				d, p := ms(st.direct), ms(st.proxied)
				direct, proxied, added = append(direct, d), append(proxied, p), append(added, p-d)
			}
		}
		names := make([]string, len(ts))
		for i := range ts {
			names[i] = ts[i].Name
		}
		b.Logf("sampled: the %d transcripts at every eighth place by name, %d requests: %v", len(ts), len(added), names)
		b.ReportMetric(float64(len(added)), "requests")
		b.ReportMetric(quantile(direct, 0.5), "direct-p50-ms")
		b.ReportMetric(quantile(direct, 0.99), "direct-p99-ms")
		b.ReportMetric(quantile(proxied, 0.5), "proxy-p50-ms")
		b.ReportMetric(quantile(proxied, 0.99), "proxy-p99-ms")
		b.ReportMetric(quantile(added, 0.5), "added-p50-ms")
		b.ReportMetric(quantile(added, 0.99), "added-p99-ms")
	}
}

// BenchmarkProxyReplay replays every shared transcript as an agent loop
// through the proxy, a few at a time, and reports the share of upstream
// requests whose message list starts with the previous request's forwarded
// list byte for byte (the provider's prompt cache hits), separately for
// the requests right after a reduction, and what went upstream against
// sending every turn's full history: ctxpipe's token counts and the bytes
// of the message lists.
func BenchmarkProxyReplay(b *testing.B) {
	ts := loadTranscripts(b)
	// The longest first, so that the workers finish together.
	slices.SortStableFunc(ts, func(x, y quality.Transcript) int { return int(y.Bytes - x.Bytes) })
	for range b.N {
		rp := newReplayer(b, ts)
		rp.stream = true
		start := time.Now()
		runs := make([]*replayRun, len(ts))
		errs := make([]error, len(ts))
		var wg sync.WaitGroup
		next := make(chan int)
		for range 2 * runtime.GOMAXPROCS(0) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					runs[i], errs[i] = rp.run(context.Background(), ts[i], "rep-"+convSafe(ts[i].Name))
				}
			}()
		}
		for i := range ts {
			next <- i
		}
		close(next)
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
		s := summarize(runs)
		b.Log(s)
		b.ReportMetric(float64(s.transcripts), "transcripts")
		b.ReportMetric(float64(s.requests), "requests")
		b.ReportMetric(float64(s.reductions), "reductions")
		b.ReportMetric(pct(s.kept, s.between), "prefix-kept-%")
		b.ReportMetric(float64(s.between-s.kept), "prefix-broken")
		b.ReportMetric(float64(s.after), "after-reduction")
		b.ReportMetric(float64(s.keptAfter), "after-reduction-kept")
		b.ReportMetric(pct(s.ctxTokens, s.fullTokens), "upstream-tokens-%")
		b.ReportMetric(pct(s.upBytes, s.clientBytes), "upstream-bytes-%")
		b.ReportMetric(float64(s.requests)/time.Since(start).Seconds(), "requests/s")
	}
}

// convSafe is a transcript name as a conversation id (they already are).
func convSafe(name string) string { return fitID(name) }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// quantile is the q-quantile of vs (nearest rank).
func quantile(vs []float64, q float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}
