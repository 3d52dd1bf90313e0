package bus

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ctxpipe/ctxpipe/internal/natstest"
)

// logBuffer collects log lines written from the nats client's goroutines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func newLogBuffer() (*logBuffer, *slog.Logger) {
	b := &logBuffer{}
	return b, slog.New(slog.NewTextHandler(b, nil))
}

// waitLog waits until the log holds a line with every one of parts, and
// returns that line. The limit only bounds a broken test.
func waitLog(t *testing.T, b *logBuffer, parts ...string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for line := range strings.Lines(b.String()) {
			found := true
			for _, p := range parts {
				found = found && strings.Contains(line, p)
			}
			if found {
				return line
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no log line with %q; log:\n%s", parts, b.String())
	return ""
}

// TestConnLogs: every line about a connection goes to ConnConfig.Log (not
// the default logger, which ignores --log-format and --log-level), names
// the connection even when only a nats.Name option does, and every error
// line is followed by its recovery.
func TestConnLogs(t *testing.T) {
	var defaultLog logBuffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&defaultLog, nil)))
	defer slog.SetDefault(old)

	port := natstest.FreePort(t)
	srv, url := natstest.RunPort(t, port)
	logs, log := newLogBuffer()
	nc, err := Connect(ConnConfig{URL: url, Log: log}, nats.Name("ctxpipe-consumer"), nats.ReconnectWait(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}

	srv.Shutdown()
	srv.WaitForShutdown()
	waitLog(t, logs, "level=WARN", `msg="nats disconnected, reconnecting"`, "name=ctxpipe-consumer", "err=")
	natstest.RunPort(t, port)
	waitLog(t, logs, "level=INFO", `msg="nats reconnected"`, "name=ctxpipe-consumer", "url=nats://127.0.0.1:", "down=")

	// A slow consumer is an error until the subscription keeps up again.
	release := make(chan struct{})
	sub, err := nc.Subscribe("slow", func(*nats.Msg) { <-release })
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.SetPendingLimits(1, -1); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if err := nc.Publish("slow", nil); err != nil {
			t.Fatal(err)
		}
	}
	waitLog(t, logs, "level=ERROR", `msg="nats async error"`, "name=ctxpipe-consumer", "subject=slow", "slow consumer")
	close(release)
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // let the handler drain the queue
	if err := nc.Publish("slow", nil); err != nil {
		t.Fatal(err)
	}
	waitLog(t, logs, "level=INFO", `msg="nats subscription caught up"`, "name=ctxpipe-consumer", "subject=slow", "dropped_total=")

	nc.Close()
	waitLog(t, logs, "level=INFO", `msg="nats connection closed"`, "name=ctxpipe-consumer")
	if s := defaultLog.String(); s != "" {
		t.Fatalf("the default logger got:\n%s", s)
	}
	if strings.Contains(logs.String(), `name=""`) || strings.Contains(logs.String(), "name= ") {
		t.Fatalf("a line without the connection name:\n%s", logs.String())
	}
}

// TestConnNameDefault: with no name at all, lines carry the program's name.
func TestConnNameDefault(t *testing.T) {
	srv, url := natstest.Run(t)
	logs, log := newLogBuffer()
	nc, err := Connect(ConnConfig{URL: url, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	srv.Shutdown()
	waitLog(t, logs, "nats disconnected", "name="+filepath.Base(os.Args[0]))
}

// TestConnectRetryWaitsForServer: the broker is not up when the service
// starts; ConnectRetry says so, keeps trying, and connects once it is up.
func TestConnectRetryWaitsForServer(t *testing.T) {
	port := natstest.FreePort(t)
	url := natsURLPort(port)
	logs, log := newLogBuffer()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type result struct {
		nc  *nats.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		nc, err := ConnectRetry(ctx, ConnConfig{URL: url, Name: "retry-test", Log: log})
		done <- result{nc, err}
	}()
	waitLog(t, logs, "level=WARN", `msg="nats not reachable, retrying in `, "name=retry-test", "attempt=2")
	natstest.RunPort(t, port)
	r := <-done
	if r.err != nil {
		t.Fatalf("ConnectRetry: %v", r.err)
	}
	defer r.nc.Close()
	if !r.nc.IsConnected() {
		t.Fatal("returned a connection that is not connected")
	}
	waitLog(t, logs, "level=INFO", `msg="nats connected"`, "name=retry-test", "attempts=", "waited=")
}

func natsURLPort(port int) string { return "nats://127.0.0.1:" + strconv.Itoa(port) }

// TestConnectRetryStops: ConnectRetry returns when its context ends, and at
// once when retrying cannot help.
func TestConnectRetryStops(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "auth.conf")
	if err := os.WriteFile(conf, []byte(`authorization { users = [ { user: a, password: b } ] }`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, authURL := natstest.RunWithConfig(t, conf)
	down := natsURLPort(natstest.FreePort(t))
	tests := []struct {
		name    string
		cfg     ConnConfig
		ctx     func() (context.Context, context.CancelFunc)
		wantErr error
		within  time.Duration
	}{
		{"cancelled", ConnConfig{URL: down}, func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(300*time.Millisecond, cancel)
			return ctx, cancel
		}, context.Canceled, 5 * time.Second},
		{"deadline", ConnConfig{URL: down}, func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 300*time.Millisecond)
		}, context.DeadlineExceeded, 5 * time.Second},
		{"authorization refused", ConnConfig{URL: authURL, User: "a", Password: "wrong"}, func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), time.Minute)
		}, nats.ErrAuthorization, 5 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, log := newLogBuffer()
			tt.cfg.Log = log
			ctx, cancel := tt.ctx()
			defer cancel()
			start := time.Now()
			nc, err := ConnectRetry(ctx, tt.cfg)
			if nc != nil {
				nc.Close()
			}
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if d := time.Since(start); d > tt.within {
				t.Fatalf("returned after %v", d)
			}
		})
	}
}
