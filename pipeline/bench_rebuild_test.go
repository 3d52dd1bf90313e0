package pipeline_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/ctxpipe/ctxpipe/changelog"
	llm "github.com/ctxpipe/ctxpipe/condense"
	"github.com/ctxpipe/ctxpipe/engine"
	"github.com/ctxpipe/ctxpipe/pipeline"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/store"
	"github.com/ctxpipe/ctxpipe/tokens"
)

// BenchmarkRebuild is the changelog replay rate (goal ≥ 50,000 changes/s): the 43
// real agent runs go through the service once (not timed), which leaves
// their changes in CTX_STATE; each iteration then rebuilds new SQLite
// files (benchFiles(), as the service splits its state) from CTX_STATE
// alone, all at once, each from its partitions (changelog.RebuildSet; a
// bulk load, made durable before it returns: store.WithBulkLoad), and the
// benchmark reports changes (inputs applied) per second over all iterations, with
// the best and the worst iteration. The last files rebuilt must be
// identical to the service's (store.Diff), or the benchmark fails.
func BenchmarkRebuild(b *testing.B) {
	subjects, payloads, ids := transcriptTurns(b)
	if _, err := tokens.O200K(); err != nil {
		b.Fatal(err)
	}
	js := loadStream(b, subjects, payloads, ids)
	ctx := context.Background()
	// The state split over benchFiles() files, rebuilt all at once, each
	// file from its partitions (changelog.RebuildSet).
	st, err := store.OpenSet(ctx, b.TempDir(), benchFiles())
	if err != nil {
		b.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	eng := engine.NewEngine(llm.NewRouter(llm.Config{}, log))
	eng.Log = log
	p := schema.Profile{ID: schema.DefaultProfileID, ContextWindow: 64000, MaxTokens: 8192}
	m := pipeline.NewMetrics()
	r, err := pipeline.New(pipeline.Config{}, pipeline.Deps{JS: js, Stores: st, Engine: eng,
		Profiles: pipeline.StaticProfiles(p), Log: log, Metrics: m})
	if err != nil {
		b.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	for m.Value("ctxpipe_inputs_total", `outcome="applied"`) < float64(len(payloads)) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	_ = st.Close()

	b.ResetTimer()
	var (
		stats       changelog.RebuildStats
		took        time.Duration
		best, worst float64
		rebuilt     string
	)
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		rebuilt = b.TempDir()
		fresh, err := store.OpenSet(ctx, rebuilt, benchFiles(), store.WithBulkLoad())
		if err != nil {
			b.Fatal(err)
		}
		// As consumer --rebuild: under a context that a signal cancels.
		rctx, cancel := context.WithCancel(ctx)
		b.StartTimer()
		stats, err = changelog.RebuildSet(rctx, js, fresh, changelog.RebuildOptions{})
		b.StopTimer()
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		_ = fresh.Close()
		if stats.Entries != len(payloads) {
			b.Fatalf("rebuilt %d changes, the service applied %d", stats.Entries, len(payloads))
		}
		took += stats.Took
		rate := stats.PerSecond()
		if i == 0 || rate > best {
			best = rate
		}
		if i == 0 || rate < worst {
			worst = rate
		}
		b.StartTimer()
	}
	b.StopTimer()
	for i := range benchFiles() {
		report, err := store.Diff(ctx, st.File(i).Path(), filepath.Join(rebuilt, store.SetFileName(i)))
		if err != nil {
			b.Fatal(err)
		}
		if !report.Identical() {
			b.Fatalf("rebuilt file %d differs from the service's:\n%s", i, report)
		}
	}
	b.ReportMetric(float64(b.N*len(payloads))/took.Seconds(), "changes/s")
	b.ReportMetric(best, "best-changes/s")
	b.ReportMetric(worst, "worst-changes/s")
	b.ReportMetric(float64(stats.Records), "records")
	b.ReportMetric(float64(stats.Messages), "messages")
}
