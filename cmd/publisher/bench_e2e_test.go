package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkEndToEnd is the end-to-end throughput and latency as `make
// bench` reports them: the service binary on its embedded defaults (NATS JetStream in its
// process, SQLite, the offline condenser) and this command in the test
// process, over TCP, as the README's commands run them, each figure beside
// its anchor from the same run.
//
//   - load: 50 conversations × 200 small turns, --wait: end-to-end turns/s
//     (acked only once committed, and read back), beside the rate at which
//     CTX_IN took the same turns (publish-turns/s), and beside the same
//     command through JetStream alone (bare-e2e-turns/s: testdata/barejs,
//     a process holding the server and a consumer that acks at once).
//   - agents: 24 agents at 1,000 turns/s, each reading its history after
//     every turn with `after` (incremental): turns/s, p50 and p99 publish →
//     readable and bytes per read, beside the same workload reading the
//     whole history every time (full-*).
func BenchmarkEndToEnd(b *testing.B) {
	bin := buildService(b)
	bare := buildBare(b)
	for range b.N {
		b.ReportMetric(bareLoad(b, bare, 50*200, "load", "--convs", "50", "--turns", "200", "--size", "small"), "bare-e2e-turns/s")

		url := startService(b, bin)
		auth := []string{"--nats-url", url, "--nats-user", "acme-agent", "--nats-password", "acme-agent-demo-password"}

		out := runCommand(b, append([]string{"load", "--convs", "50", "--turns", "200", "--size", "small", "--wait"}, auth...))
		b.ReportMetric(figure(b, out, `published [\d,]+ turns, .*?: ([\d,]+) turns/s`), "publish-turns/s")
		b.ReportMetric(figure(b, out, `([\d,]+) turns/s end to end`), "e2e-turns/s")

		agents := append([]string{"load", "--agent", "--convs", "24", "--turns", "100", "--rate", "1000"}, auth...)
		for _, mode := range []struct{ prefix, flag string }{{"", ""}, {"full-", "--full-reads"}} {
			args := agents
			if mode.flag != "" {
				args = append(slices.Clone(agents), mode.flag)
			}
			out := runCommand(b, args)
			b.ReportMetric(figure(b, out, `agents: [\d,]+ turns in \S+, ([\d,]+) turns/s`), mode.prefix+"agent-turns/s")
			b.ReportMetric(ms(b, out, `publish → readable p50 (\S+) p99`), mode.prefix+"p50-ms")
			b.ReportMetric(ms(b, out, `publish → readable p50 \S+ p99 ([^;]+);`), mode.prefix+"p99-ms")
			b.ReportMetric(figure(b, out, `([\d,]+) bytes per read`), mode.prefix+"bytes/read")
		}
	}
}

// runCommand runs the command and returns what it printed.
func runCommand(b *testing.B, args []string) string {
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), args, &stdout, &stderr); code != 0 {
		b.Fatalf("%v: exit %d\n%s%s", args, code, stdout.String(), stderr.String())
	}
	return stdout.String() + stderr.String()
}

// figure is the number the first group of pattern matches in out.
func figure(b *testing.B, out, pattern string) float64 {
	m := regexp.MustCompile(pattern).FindStringSubmatch(out)
	if m == nil {
		b.Fatalf("no %q in the command's output:\n%s", pattern, out)
	}
	v, err := strconv.ParseFloat(strings.ReplaceAll(m[1], ",", ""), 64)
	if err != nil {
		b.Fatalf("%q in %q: %v", m[1], pattern, err)
	}
	return v
}

// ms is the duration the first group of pattern matches in out, in ms.
func ms(b *testing.B, out, pattern string) float64 {
	m := regexp.MustCompile(pattern).FindStringSubmatch(out)
	if m == nil {
		b.Fatalf("no %q in the command's output:\n%s", pattern, out)
	}
	d, err := time.ParseDuration(strings.TrimSpace(m[1]))
	if err != nil {
		b.Fatalf("%q in %q: %v", m[1], pattern, err)
	}
	return float64(d) / float64(time.Millisecond)
}

// bareLoad runs the command (a load of n turns) against testdata/barejs and
// returns the rate from the first turn's arrival to the last ack.
func bareLoad(b *testing.B, bin string, n int, args ...string) float64 {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(bin, "--listen", addr, "-n", strconv.Itoa(n))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() || lines.Text() != "ready" {
		b.Fatalf("barejs did not start: %q %s", lines.Text(), stderr.String())
	}
	runCommand(b, append(args, "--nats-url", "nats://"+addr))
	if !lines.Scan() {
		b.Fatalf("barejs ended without acking: %s", stderr.String())
	}
	var acked int
	var first, last int64
	if _, err := fmt.Sscanf(lines.Text(), "acked %d from %d to %d", &acked, &first, &last); err != nil || acked != n || last <= first {
		b.Fatalf("barejs said %q (%v)", lines.Text(), err)
	}
	return float64(n) / time.Duration(last-first).Seconds()
}

// buildBare builds testdata/barejs, the anchor of the load figure.
func buildBare(b *testing.B) string {
	bin := filepath.Join(b.TempDir(), "barejs")
	cmd := exec.Command("go", "build", "-o", bin, "./testdata/barejs")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// buildService builds the service binary (cmd/consumer), or returns the
// one CTXPIPE_BENCH_SERVICE names: another commit's build, to compare two
// versions back to back under the same benchmark.
func buildService(b *testing.B) string {
	if bin := os.Getenv("CTXPIPE_BENCH_SERVICE"); bin != "" {
		b.Logf("service binary %s (CTXPIPE_BENCH_SERVICE)", bin)
		return bin
	}
	bin := filepath.Join(b.TempDir(), "consumer")
	cmd := exec.Command("go", "build", "-o", bin, "../consumer")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// startService starts the service on its embedded defaults in a fresh data
// directory, listening on a free port, and returns its URL once a client
// can connect; it is stopped when the benchmark ends.
func startService(b *testing.B, bin string) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	dir := b.TempDir()
	logPath := filepath.Join(dir, "consumer.log")
	startConsumer(b, bin, logPath, "--data-dir", filepath.Join(dir, "data"), "--listen", addr, "--http", "")
	url := "nats://" + addr
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		var out bytes.Buffer
		// The service answers queries once it is consuming: here, that
		// there is no such conversation.
		run(context.Background(), []string{"status", "--conv", "none", "--nats-url", url,
			"--nats-user", "acme-agent", "--nats-password", "acme-agent-demo-password"}, &out, &out)
		if strings.Contains(out.String(), "not_found") {
			return url
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logPath)
			b.Fatalf("the service did not answer within a minute: %s\n%s", out.String(), log)
		}
	}
}

// startConsumer starts the consumer binary bin with args, its output going
// to the file logPath, and stops it when b ends: an interrupt, then a kill
// if it has not exited within 30 s.
func startConsumer(b *testing.B, bin, logPath string, args ...string) *exec.Cmd {
	b.Helper()
	logf, err := os.Create(logPath)
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		logf.Close()
	})
	return cmd
}
