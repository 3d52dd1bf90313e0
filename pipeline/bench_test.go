package pipeline_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/internal/natstest"
	"github.com/ctxpipe/ctxpipe/internal/transcripts"
	"github.com/ctxpipe/ctxpipe/llm"
	"github.com/ctxpipe/ctxpipe/pipeline"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/stages"
	"github.com/ctxpipe/ctxpipe/store"
	"github.com/ctxpipe/ctxpipe/tokens"
)

// transcriptTurns loads the real agent runs as raw turn payloads.
func transcriptTurns(b *testing.B) (subjects []string, payloads [][]byte, ids []string) {
	b.Helper()
	for _, l := range transcripts.All(b, "../../shared/data/transcripts") {
		subjects = append(subjects, schema.InputSubject(l.Turn.ConversationID, schema.KindTurn))
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
// and does nothing else.
func BenchmarkPipeline(b *testing.B) {
	subjects, payloads, ids := transcriptTurns(b)
	// The service loads the tokenizer's vocabulary once, at start; the
	// figure is the steady state, not that.
	if _, err := tokens.O200K(); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		js := loadStream(b, subjects, payloads, ids)
		st, err := store.Open(context.Background(), filepath.Join(b.TempDir(), "bench.db"))
		if err != nil {
			b.Fatal(err)
		}
		log := slog.New(slog.DiscardHandler)
		engine := stages.NewEngine(llm.NewRouter(llm.Config{}, log))
		engine.Log = log
		p := schema.Profile{ID: schema.DefaultProfileID, ContextWindow: 64000, MaxTokens: 8192}
		m := pipeline.NewMetrics()
		r, err := pipeline.New(pipeline.Config{}, pipeline.Deps{JS: js, Store: st, Engine: engine,
			Profiles: pipeline.StaticProfiles(p), Log: log, Metrics: m})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		b.StartTimer()
		start := time.Now()
		go func() { done <- r.Run(ctx) }()
		for m.Value("ctxpipe_inputs_total", `outcome="applied"`) < float64(len(payloads)) {
			time.Sleep(2 * time.Millisecond)
		}
		elapsed := time.Since(start)
		b.StopTimer()
		cancel()
		<-done
		_ = st.Close()
		b.ReportMetric(float64(len(payloads))/elapsed.Seconds(), "turns/s")
		b.ReportMetric(m.Value("ctxpipe_commits_total", ""), "commits")
		b.ReportMetric(m.Value("ctxpipe_events_total", `type="condense_context"`), "condenses")
	}
}

// BenchmarkRawConsumeAck is the ceiling: the same stream, the same consumer
// settings, each message acked as soon as it arrives.
func BenchmarkRawConsumeAck(b *testing.B) {
	subjects, payloads, ids := transcriptTurns(b)
	for i := 0; i < b.N; i++ {
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
		b.ReportMetric(float64(len(payloads))/elapsed.Seconds(), "turns/s")
	}
}
