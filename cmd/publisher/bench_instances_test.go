package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ctxpipe/ctxpipe/internal/natstest"
	"github.com/ctxpipe/ctxpipe/pipeline"
)

// BenchmarkInstancesCPU is the scale-out goal as `make bench` reports it:
// the same load (50 conversations × 200 small turns, --wait, as tenant acme's
// agent) through one instance of the service and through three, each time
// against one server started from nats.conf in the test process, and the
// CPU seconds of all the service processes together per applied turn
// (measured from when every instance holds its partitions, before the
// load, to 3 s after its last turn was read back). Before the load, each
// instance's CPU while idle is measured apart (ms per second, per
// instance): what an instance costs whatever the load. The ratios to one
// instance are the figures: at most 1.5 with --standby 1 (every partition
// applied by its owner and followed by one standby) and 1.2 with
// --standby 0 (applied once). The machine may be shared: the ratios, not
// the µs, are what count.
func BenchmarkInstancesCPU(b *testing.B) {
	bin := buildService(b)
	const turns = 50 * 200
	for range b.N {
		one, idle := instancesCPU(b, bin, 1, 1, turns)
		b.ReportMetric(one, "k1-µs/turn")
		b.ReportMetric(idle, "k1-idle-ms/s")
		for _, standby := range []int{1, 0} {
			three, idle := instancesCPU(b, bin, 3, standby, turns)
			b.ReportMetric(idle, fmt.Sprintf("k3-standby%d-idle-ms/s", standby))
			b.ReportMetric(three, fmt.Sprintf("k3-standby%d-µs/turn", standby))
			b.ReportMetric(three/one, fmt.Sprintf("k3-standby%d/k1", standby))
		}
	}
}

// instancesCPU runs k instances with --standby standby on a fresh server,
// puts the load through them and returns their CPU µs per turn, and the
// CPU ms per second each used while idle before the load.
func instancesCPU(b *testing.B, bin string, k, standby, turns int) (perTurn, idle float64) {
	b.Helper()
	const partitions = 48
	_, url := natstest.RunWithConfig(b, "../../nats.conf")
	dir := b.TempDir()
	var names []string
	var procs []*exec.Cmd
	var https []string
	for i := 1; i <= k; i++ {
		name := "i" + strconv.Itoa(i)
		names = append(names, name)
		http := freeLocal(b)
		https = append(https, http)
		cmd := startConsumer(b, bin, filepath.Join(dir, name+".log"), "--nats-url", url, "--nats-user", "ctxpipe", "--nats-password", "ctxpipe-demo-password",
			"--partitions", strconv.Itoa(partitions), "--standby", strconv.Itoa(standby), "--name", name,
			"--data-dir", filepath.Join(dir, name), "--http", http)
		procs = append(procs, cmd)
	}
	// Every instance holds its share, restored, before the load.
	for i, name := range names {
		a := pipeline.Assign(partitions+1, names, name, true, standby)
		want := 0
		for _, h := range a.Held {
			if h {
				want++
			}
		}
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
			m := scrape(https[i])
			if metric(m, "ctxpipe_partitions_held") == float64(want) && metric(m, "ctxpipe_changelog_behind") == 0 &&
				strings.Contains(m, "ctxpipe_partitions_held ") {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("%s does not hold its %d partitions: %q", name, want, m)
			}
		}
	}
	time.Sleep(2 * time.Second) // the lock refreshes, the last handovers
	tag := fmt.Sprintf("k%d-standby%d", k, standby)
	// What the instances cost while nothing arrives: their fixed costs
	// (the lock, the live list, the probes), reported apart.
	stopIdle := profileInstances(b, names, https, tag+"-idle")
	i0 := cpuOf(b, procs)
	time.Sleep(idleWindow)
	idle = float64((cpuOf(b, procs) - i0).Microseconds()) / 1000 / idleWindow.Seconds() / float64(k)
	stopIdle()
	stopProfiles := profileInstances(b, names, https, tag)
	defer stopProfiles()
	c0 := cpuOf(b, procs)
	out := runCommand(b, []string{"load", "--convs", "50", "--turns", "200", "--size", "small", "--seed", "7", "--wait",
		"--nats-url", url, "--nats-user", "acme-agent", "--nats-password", "acme-agent-demo-password"})
	c1 := cpuOf(b, procs)
	time.Sleep(3 * time.Second) // the standbys apply the last records
	used := cpuOf(b, procs) - c0
	b.Logf("%d instance(s), standby %d: %.2f CPU s for %d turns, %.2f s of them in the 3 s after the load (%s)", k, standby,
		used.Seconds(), turns, (c0 + used - c1).Seconds(), strings.TrimSpace(regexpLine(out, "turns/s end to end")))
	for i, name := range names {
		m := scrape(https[i])
		b.Logf("  %s: %.0f inputs applied in %.0f commits, %.0f changelog records of others applied, %.0f queries passed on",
			name, metric(m, `ctxpipe_inputs_total{outcome="applied"}`), metric(m, "ctxpipe_commits_total"),
			metric(m, "ctxpipe_changelog_applied_total"), metric(m, "ctxpipe_queries_forwarded_total"))
	}
	return float64(used.Microseconds()) / float64(turns), idle
}

// idleWindow is how long instancesCPU measures the instances idle, before
// the load.
const idleWindow = 5 * time.Second

// profileInstances, when CTXPIPE_BENCH_PPROF names a directory, records
// each instance's CPU profile in 2 s slices until the returned function is
// called (<dir>/<tag>-<name>-<i>.pprof; `go tool pprof` merges the slices
// given together). It does nothing otherwise.
func profileInstances(b *testing.B, names, https []string, tag string) func() {
	b.Helper()
	dir := os.Getenv("CTXPIPE_BENCH_PPROF")
	if dir == "" {
		return func() {}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{}, len(names))
	for i, name := range names {
		go func() {
			defer func() { done <- struct{}{} }()
			c := &http.Client{Timeout: 10 * time.Second}
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := c.Get("http://" + https[i] + "/debug/pprof/profile?seconds=2")
				if err != nil {
					b.Logf("profile %s: %v", name, err)
					return
				}
				data, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err == nil && resp.StatusCode == http.StatusOK {
					_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%s-%02d.pprof", tag, name, n)), data, 0o644)
				}
			}
		}()
	}
	return func() {
		close(stop)
		for range names {
			<-done
		}
	}
}

// cpuOf is the user and system CPU time the processes used so far (Linux:
// /proc/<pid>/stat).
func cpuOf(b *testing.B, procs []*exec.Cmd) time.Duration {
	b.Helper()
	var ticks int64
	for _, p := range procs {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Process.Pid))
		if err != nil {
			b.Skipf("no /proc: %v", err)
		}
		// The fields after the command name (which may hold spaces):
		// utime and stime are the 14th and 15th of the line.
		s := string(data)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		u, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + st
	}
	// USER_HZ is 100 on every Linux the service runs on.
	return time.Duration(ticks) * 10 * time.Millisecond
}

func freeLocal(b *testing.B) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// scrape is an instance's /metrics ("" when it does not answer yet).
func scrape(addr string) string {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return string(data)
}

// metric is a series' value in a scrape (-1 when absent).
func metric(scrape, series string) float64 {
	for _, line := range strings.Split(scrape, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

// regexpLine is the first line of out that contains s.
func regexpLine(out, s string) string {
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, s) {
			return line
		}
	}
	return ""
}
