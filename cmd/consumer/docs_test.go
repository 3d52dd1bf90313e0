package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
)

// helpText is what `consumer -h` prints.
func helpText(t *testing.T) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := os.Stderr
	os.Stderr = w
	err = NewMain().ParseFlags([]string{"-h"})
	os.Stderr = stderr
	w.Close()
	out, _ := io.ReadAll(r)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	return string(out)
}

var (
	helpFlag  = regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`)
	tableFlag = regexp.MustCompile("(?m)^\\| `--([a-z0-9-]+)` \\|")
)

// The flags table of operations.md 1.2 lists exactly the flags `consumer -h`
// prints: none missing from the table (a flag registered any way, not only
// with fs.XxxVar), none the program does not have.
func TestFlagsTableMatchesHelp(t *testing.T) {
	t.Setenv("NATS_URL", "")
	var help []string
	for _, m := range helpFlag.FindAllStringSubmatch(helpText(t), -1) {
		help = append(help, m[1])
	}
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n### 1.2 Flags\n")
	if !ok {
		t.Fatal("operations.md has no section 1.2 Flags")
	}
	section, _, _ = strings.Cut(section, "\n### ")
	var table []string
	for _, m := range tableFlag.FindAllStringSubmatch(section, -1) {
		table = append(table, m[1])
	}
	if len(help) < 20 || len(table) < 20 {
		t.Fatalf("read %d flags from -h and %d from the table: a format changed", len(help), len(table))
	}
	for _, f := range help {
		if !slices.Contains(table, f) {
			t.Errorf("`consumer -h` lists --%s, which the flags table of operations.md 1.2 does not", f)
		}
	}
	for _, f := range table {
		if !slices.Contains(help, f) {
			t.Errorf("the flags table of operations.md 1.2 lists --%s, which `consumer -h` does not", f)
		}
	}
	slices.Sort(table)
	if d := slices.Compact(slices.Clone(table)); len(d) != len(table) {
		t.Errorf("the flags table lists a flag twice: %v", table)
	}
}

// The commands the docs tell an operator to type exist: `consumer rebuild`
// is no command (it exits 2); `consumer --rebuild` is.
func TestDocsNameTheRebuildFlag(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(doc), "consumer rebuild") {
		t.Error("operations.md says `consumer rebuild`; the command is `consumer --rebuild`")
	}
	if err := NewMain().ParseFlags([]string{"rebuild"}); err == nil {
		t.Error("`consumer rebuild` parses: the docs' rule that it is no command is out of date")
	}
}

func TestNATSEndpoint(t *testing.T) {
	cases := []struct {
		name                 string
		embedded             bool
		clientURL, connected string
		want                 string
	}{
		{"external server", false, "", "nats://10.0.0.5:4222", "nats://10.0.0.5:4222"},
		{"embedded, listening", true, "nats://127.0.0.1:4222", "nats://127.0.0.1:4222", "nats://127.0.0.1:4222"},
		{"embedded on another port", true, "nats://127.0.0.1:5333", "nats://127.0.0.1:4222", "nats://127.0.0.1:5333"},
		{"embedded, no client port", true, "", "nats://127.0.0.1:4222", `embedded, in process only (--listen "": no client port)`},
	}
	for _, c := range cases {
		if got := natsEndpoint(c.embedded, c.clientURL, c.connected); got != c.want {
			t.Errorf("%s: natsEndpoint = %q, want %q", c.name, got, c.want)
		}
	}
}

// lockedBuffer is a log destination safe for the service's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// The start line names the NATS address clients can reach: with
// --listen="" the embedded server opens no client port, and the line says
// so instead of the default URL nothing listens on.
func TestStartLineNamesTheClientPort(t *testing.T) {
	for _, k := range llmEnv {
		t.Setenv(k, "")
	}
	t.Setenv("NATS_URL", "")
	for _, c := range []struct {
		listen string
		want   *regexp.Regexp
	}{
		{"", regexp.MustCompile(`msg="ctxpipe running" nats="embedded, in process only \(--listen \\"\\": no client port\)"`)},
		{"127.0.0.1:-1", regexp.MustCompile(`msg="ctxpipe running" nats=nats://127\.0\.0\.1:(\d+) `)},
	} {
		t.Run("listen="+c.listen, func(t *testing.T) {
			var logs lockedBuffer
			m := NewMain()
			m.Config.DataDir = t.TempDir()
			m.Config.Listen = c.listen
			m.Config.HTTP = ""
			m.Log = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
			if err := m.Run(context.Background()); err != nil {
				_ = m.Close()
				t.Fatalf("run: %v", err)
			}
			defer m.Close()
			line := ""
			for l := range strings.SplitSeq(logs.String(), "\n") {
				if strings.Contains(l, `msg="ctxpipe running"`) {
					line = l
				}
			}
			match := c.want.FindStringSubmatch(line)
			if match == nil {
				t.Fatalf("start line %q does not match %s", line, c.want)
			}
			if len(match) > 1 && match[1] == "4222" {
				t.Fatalf("a random port was asked for, the line says 4222: %q", line)
			}
		})
	}
}
