package pipeline_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	llm "github.com/ctxpipe/ctxpipe/condense"
	"github.com/ctxpipe/ctxpipe/engine"
	"github.com/ctxpipe/ctxpipe/internal/natstest"
	"github.com/ctxpipe/ctxpipe/internal/transcripts"
	"github.com/ctxpipe/ctxpipe/pipeline"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/store"
	"github.com/ctxpipe/ctxpipe/tokens"
)

// transcriptTurns loads the real agent runs as raw turn payloads.
func transcriptTurns(b *testing.B) (subjects []string, payloads [][]byte, ids []string) {
	b.Helper()
	for _, l := range transcripts.All(b, "../../shared/data/transcripts") {
		// Under a tenant, as an agent's turns arrive (through its tenant
		// account): the conversations spread over the partitions.
		subjects = append(subjects, schema.InputSubject(schema.ConversationKey("bench", l.Turn.ConversationID), schema.KindTurn))
		payloads = append(payloads, l.Raw)
		ids = append(ids, l.Turn.ID)
	}
	return subjects, payloads, ids
}

// loadStream starts a fresh server and fills CTX_IN with the payloads.
func loadStream(b *testing.B, subjects []string, payloads [][]byte, ids []string) jetstream.JetStream {
	b.Helper()
	_, url := natstest.Run(b)
	nc := natstest.Connect(b, url)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := bus.EnsureStreams(ctx, js); err != nil {
		b.Fatal(err)
	}
	for i := range payloads {
		if _, err := js.PublishAsync(subjects[i], payloads[i], jetstream.WithMsgID(ids[i])); err != nil {
			b.Fatal(err)
		}
		if i%1000 == 999 || i == len(payloads)-1 {
			select {
			case <-js.PublishAsyncComplete():
			case <-time.After(time.Minute):
				b.Fatal("publish did not complete")
			}
		}
	}
	return js
}

// BenchmarkPipeline measures end to end: the 43 real agent runs (7.7 k
// turns, with tool calls and results) already in CTX_IN, consumed, counted
// exactly, decided (with real condenses by the offline condenser), committed
// with synchronous=FULL and acked. Compare with BenchmarkRawConsumeAck,
// which consumes and acks the same stream with the same consumer settings
// and does nothing else, or run BenchmarkPipelineVsRaw, which runs both in
// turn and reports the ratio.
func BenchmarkPipeline(b *testing.B) {
	subjects, payloads, ids := transcriptTurns(b)
	// The service loads the tokenizer's vocabulary once, at start; the
	// figure is the steady state, not that.
	if _, err := tokens.O200K(); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < b.N; i++ {
		rate, m := runPipeline(b, subjects, payloads, ids)
		b.ReportMetric(rate, "turns/s")
		b.ReportMetric(m.Value("ctxpipe_commits_total", ""), "commits")
		b.ReportMetric(m.Value("ctxpipe_events_total", `type="condense_context"`), "condenses")
		b.ReportMetric(m.Value("bench_cpu_cores", ""), "cpu-cores")
		b.ReportMetric(m.Value("bench_cpu_seconds", "")*1e6/float64(len(payloads)), "cpu-µs/turn")
		// Where the single committer's time goes, per run: the SQL of a
		// round, the changelog append, the SQLite commit (fsync).
		for _, phase := range []string{"apply", "append", "sync"} {
			b.ReportMetric(m.Value("ctxpipe_commit_phase_seconds_sum", fmt.Sprintf("phase=%q", phase))*1000, phase+"-ms")
		}
		// The committers run in parallel, one per file: the busiest one's
		// time is the serial part.
		busiest := 0.0
		for i := range benchFiles() {
			busiest = max(busiest, m.Value("ctxpipe_commit_file_seconds_sum", fmt.Sprintf("file=%q", strconv.Itoa(i))))
		}
		b.ReportMetric(busiest*1000, "busiest-committer-ms")
		b.ReportMetric(busiest*1e6/float64(len(payloads)), "busiest-committer-µs/turn")
		// What a turn costs to keep: CTX_STATE's bytes (the changelog
		// records, with the stream's per-message overhead) and the
		// SQLite files' pages in use.
		b.ReportMetric(m.Value("bench_state_bytes", "")/float64(len(payloads)), "state-B/turn")
		b.ReportMetric(m.Value("bench_db_bytes", "")/float64(len(payloads)), "db-B/turn")
	}
}

// benchFiles is how many SQLite files the benchmarks split the state over:
// the service's default, or CTXPIPE_BENCH_FILES.
func benchFiles() int {
	if n, err := strconv.Atoi(os.Getenv("CTXPIPE_BENCH_FILES")); err == nil && n > 0 {
		return n
	}
	return benchDefaultFiles
}

// benchDefaultFiles is the number of files measured unless told otherwise.
const benchDefaultFiles = store.DefaultSetFiles

// runPipeline runs the pipeline over the stream once, timing it alone.
func runPipeline(b *testing.B, subjects []string, payloads [][]byte, ids []string) (rate float64, m *pipeline.Metrics) {
	b.StopTimer()
	js := loadStream(b, subjects, payloads, ids)
	st, err := store.OpenSet(context.Background(), b.TempDir(), benchFiles())
	if err != nil {
		b.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	eng := engine.NewEngine(llm.NewRouter(llm.Config{}, log))
	eng.Log = log
	p := schema.Profile{ID: schema.DefaultProfileID, ContextWindow: 64000, MaxTokens: 8192}
	m = pipeline.NewMetrics()
	r, err := pipeline.New(pipeline.Config{}, pipeline.Deps{JS: js, Stores: st, Engine: eng,
		Profiles: pipeline.StaticProfiles(p), Log: log, Metrics: m})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	b.StartTimer()
	stopProfile := profileTimed(b)
	start, cpu0 := time.Now(), cpuTime()
	go func() { done <- r.Run(ctx) }()
	for m.Value("ctxpipe_inputs_total", `outcome="applied"`) < float64(len(payloads)) {
		time.Sleep(2 * time.Millisecond)
	}
	elapsed := time.Since(start)
	// Cores busy on average (this process: the pipeline and the in-process
	// server): below the machine's count, the run waits on latency; at it,
	// on CPU.
	cpu := (cpuTime() - cpu0).Seconds()
	m.Add("bench_cpu_cores", "", cpu/elapsed.Seconds())
	m.Add("bench_cpu_seconds", "", cpu)
	stopProfile()
	b.StopTimer()
	cancel()
	<-done
	if info, err := js.Stream(context.Background(), bus.StreamState); err == nil {
		m.Add("bench_state_bytes", "", float64(info.CachedInfo().State.Bytes))
	}
	var paths []string
	for _, f := range st.Files() {
		paths = append(paths, f.Path())
	}
	_ = st.Close()
	m.Add("bench_db_bytes", "", float64(pagesInUse(b, paths)))
	return float64(len(payloads)) / elapsed.Seconds(), m
}

// profileTimed, when CTXPIPE_BENCH_PPROF names a file, records a CPU
// profile of the timed part of every run into it (the last run's is kept):
// the stream's loading, which the figures leave out, stays out of it too.
func profileTimed(b *testing.B) (stop func()) {
	path := os.Getenv("CTXPIPE_BENCH_PPROF")
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

// pagesInUse is the bytes of the SQLite files' pages that hold data (the
// WAL's included, the free list's not).
func pagesInUse(b *testing.B, paths []string) int64 {
	var total int64
	for _, p := range paths {
		db, err := sql.Open("sqlite3", "file:"+p+"?mode=ro")
		if err != nil {
			b.Fatal(err)
		}
		var n int64
		err = db.QueryRow(`SELECT (SELECT page_count FROM pragma_page_count()) - (SELECT freelist_count FROM pragma_freelist_count())`).Scan(&n)
		var size int64
		if err == nil {
			err = db.QueryRow(`SELECT page_size FROM pragma_page_size()`).Scan(&size)
		}
		db.Close()
		if err != nil {
			b.Fatal(err)
		}
		total += n * size
	}
	return total
}

// BenchmarkRawConsumeAck is the ceiling: the same stream, the same consumer
// settings, each message acked as soon as it arrives.
func BenchmarkRawConsumeAck(b *testing.B) {
	subjects, payloads, ids := transcriptTurns(b)
	for i := 0; i < b.N; i++ {
		b.ReportMetric(runRaw(b, subjects, payloads, ids), "turns/s")
	}
}

// runRaw consumes and acks the stream once, timing it alone.
func runRaw(b *testing.B, subjects []string, payloads [][]byte, ids []string) float64 {
	b.StopTimer()
	js := loadStream(b, subjects, payloads, ids)
	ctx := context.Background()
	cons, err := js.CreateOrUpdateConsumer(ctx, bus.StreamIn, jetstream.ConsumerConfig{
		Durable: "raw", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 64*256 + 1024})
	if err != nil {
		b.Fatal(err)
	}
	b.StartTimer()
	start := time.Now()
	it, err := cons.Messages(jetstream.PullMaxMessages(2048))
	if err != nil {
		b.Fatal(err)
	}
	for n := 0; n < len(payloads); n++ {
		msg, err := it.Next()
		if err != nil {
			b.Fatal(err)
		}
		if err := msg.Ack(); err != nil {
			b.Fatal(err)
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	it.Stop()
	return float64(len(payloads)) / elapsed.Seconds()
}

// BenchmarkPipelineVsRaw is the pipeline's cost beside raw consume+ack on a
// shared, noisy machine:
// each iteration runs BenchmarkRawConsumeAck's consumer and then the
// pipeline over the same stream, back to back, and the reported ratio is
// the median of the iterations' pipeline/raw (the goal: ≥ 0.20). Run it
// with -benchtime 3x or more.
func BenchmarkPipelineVsRaw(b *testing.B) {
	subjects, payloads, ids := transcriptTurns(b)
	if _, err := tokens.O200K(); err != nil {
		b.Fatal(err)
	}
	var pipes, raws, ratios []float64
	for i := 0; i < b.N; i++ {
		raw := runRaw(b, subjects, payloads, ids)
		pipe, _ := runPipeline(b, subjects, payloads, ids)
		raws, pipes, ratios = append(raws, raw), append(pipes, pipe), append(ratios, pipe/raw)
	}
	b.ReportMetric(median(pipes), "pipeline-turns/s")
	b.ReportMetric(median(raws), "raw-turns/s")
	b.ReportMetric(median(ratios), "pipeline/raw")
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// cpuTime is the CPU time this process has used, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
