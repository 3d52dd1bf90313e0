package main

import (
	"context"
	"io"
	"strconv"
	"testing"
	"time"
)

// BenchmarkLoad publishes a realistic synthetic workload (20 agents × 50
// turns per iteration) to an in-process JetStream server through the whole
// command: generation, encoding, async publish with the in-flight window,
// acks. It reports turns/s and the PubAck latency the command measured.
func BenchmarkLoad(b *testing.B) {
	for _, size := range []Size{SizeSmall, SizeRealistic} {
		b.Run(string(size), func(b *testing.B) {
			e := newEnvB(b)
			start := time.Now()
			for i := 0; i < b.N; i++ {
				args := []string{"load", "--nats-url", e.url, "--convs", "20", "--turns", "50",
					"--size", string(size), "--seed", strconv.Itoa(i + 1)}
				if code := run(context.Background(), args, io.Discard, io.Discard); code != 0 {
					b.Fatalf("load exit %d", code)
				}
			}
			b.ReportMetric(float64(b.N*1000)/time.Since(start).Seconds(), "turns/s")
		})
	}
}
