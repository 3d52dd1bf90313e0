package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/internal/natstest"
	"github.com/ctxpipe/ctxpipe/pipeline"
	"github.com/ctxpipe/ctxpipe/schema"
)

// BenchmarkServiceRSS is the service's memory bound with the broker out of
// the picture: the service runs as its own process (the binary) against a
// JetStream server in the test process; 24 turns of 4 MiB (96 MiB) across
// 12 conversations are in CTX_IN when it starts, and the figure is the
// service process's peak RSS (VmHWM) once it has applied them all, beside
// --max-held-bytes, the bound on fetched and unacked payloads, and the Go
// memory limit the service derives from it (memory.go).
func BenchmarkServiceRSS(b *testing.B) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		b.Skip("needs Linux /proc to read the peak RSS")
	}
	bin := buildConsumer(b)
	const n, convs = 24, 12
	text := strings.TrimSpace(strings.Repeat(" word", 4<<20/5-2000)) // just under 4 MiB with the JSON around it
	for _, held := range []int{256 << 20, 64 << 20} {
		b.Run(fmt.Sprintf("held=%dMiB", held>>20), func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				_, url := natstest.Run(b)
				js, err := jetstream.New(natstest.Connect(b, url))
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				if err := bus.EnsureStreams(ctx, js); err != nil {
					b.Fatal(err)
				}
				dir := b.TempDir()
				profiles := filepath.Join(dir, "profiles.json")
				if err := os.WriteFile(profiles, []byte(`[{"id":"default","context_window":50000000,"max_tokens":8192}]`), 0o644); err != nil {
					b.Fatal(err)
				}
				last := map[string]string{}
				for i := range n {
					conv := "huge-" + strconv.Itoa(i%convs)
					tn := schema.Turn{ID: uuid.NewString(), ConversationID: conv, TS: int64(1_700_000_000_000 + i),
						Role: schema.RoleUser, Content: schema.TextContent(text)}
					data, err := schema.Marshal(tn)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := bus.PublishInput(ctx, js, schema.InputSubject(conv, schema.KindTurn), tn.ID, data); err != nil {
						b.Fatal(err)
					}
					last[conv] = tn.ID
				}
				logf, err := os.Create(filepath.Join(dir, "consumer.log"))
				if err != nil {
					b.Fatal(err)
				}
				defer logf.Close()
				cmd := exec.Command(bin, "--nats-url", url, "--data-dir", filepath.Join(dir, "data"), "--http", "",
					"--profiles", profiles, "--max-held-bytes", strconv.Itoa(held))
				cmd.Env = childEnv()
				cmd.Stdout, cmd.Stderr = logf, logf
				b.StartTimer()
				start := time.Now()
				if err := cmd.Start(); err != nil {
					b.Fatal(err)
				}
				for conv, id := range last {
					req, _ := json.Marshal(schema.HistoryRequest{ConversationID: conv, WaitFor: id, TimeoutMS: 60_000, Limit: 1})
					var rep *nats.Msg
					for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
						// Until the service answers queries: no responders.
						rep, err = js.Conn().Request(schema.SubjectHistory, req, 70*time.Second)
						if !errors.Is(err, nats.ErrNoResponders) || time.Now().After(deadline) {
							break
						}
					}
					if err != nil || strings.Contains(string(rep.Data), `"error"`) {
						_ = cmd.Process.Kill()
						b.Fatalf("history of %s: %v %.300s", conv, err, rep.Data)
					}
				}
				elapsed := time.Since(start)
				b.StopTimer()
				peak := childStatus(b, cmd.Process.Pid, "VmHWM:")
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				b.ReportMetric(float64(n)/elapsed.Seconds(), "turns/s")
				b.ReportMetric(float64(peak)/(1<<20), "peak-RSS-MiB")
				b.ReportMetric(float64(held>>20), "held-bound-MiB")
				// The soft limit the service derived from the held bound.
				limit, _ := memoryLimit(Config{Pipeline: pipeline.Config{MaxHeldBytes: held}}, func(string) string { return "" })
				b.ReportMetric(float64(limit>>20), "memory-limit-MiB")
			}
		})
	}
}

// childStatus is a size field (VmHWM:, VmRSS:) of a process's
// /proc/<pid>/status, in bytes.
func childStatus(b *testing.B, pid int, field string) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, field); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb << 10
		}
	}
	b.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}
