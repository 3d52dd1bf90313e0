// Package natstest starts real, in-process nats-servers with JetStream for
// tests, each with its own store directory, shut down when the test ends.
package natstest

import (
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// MaxPayload matches the CTX_IN stream's message size limit, so tests can
// publish inputs as large as production allows (the server default is 1 MiB).
const MaxPayload = 8 << 20

// Run starts a JetStream-enabled server on a random local port with its store
// in t.TempDir(), and returns it with its client URL. It stops on t.Cleanup.
func Run(t testing.TB) (*server.Server, string) {
	t.Helper()
	return RunPort(t, -1)
}

// RunPort is Run on the given port (-1: any free one), so that a test can start a server
// where a client already tries to connect, or start one again where it was.
func RunPort(t testing.TB, port int) (*server.Server, string) {
	t.Helper()
	opts := &server.Options{
		ServerName: "natstest",
		Host:       "127.0.0.1",
		Port:       port,
		JetStream:  true,
		StoreDir:   t.TempDir(),
		MaxPayload: MaxPayload,
		NoLog:      true,
		NoSigs:     true,
	}
	return start(t, opts)
}

// FreePort returns a loopback TCP port that was free a moment ago, for a
// server a test starts later.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("natstest: free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// RunWithConfig starts a server from the configuration file at path, as
// nats-server -c would, but on a random local port, without the monitoring
// port and with JetStream's store in t.TempDir(), so it never touches the
// directories the file names and tests can run in parallel.
func RunWithConfig(t testing.TB, path string) (*server.Server, string) {
	t.Helper()
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("natstest: read config %s: %v", path, err)
	}
	opts.Host = "127.0.0.1"
	opts.Port = -1
	opts.HTTPPort = 0
	opts.HTTPSPort = 0
	opts.StoreDir = t.TempDir()
	opts.NoLog = true
	opts.NoSigs = true
	return start(t, opts)
}

func start(t testing.TB, opts *server.Options) (*server.Server, string) {
	t.Helper()
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("natstest: new server: %v", err)
	}
	go s.Start()
	// Readiness is not a timed assertion: 30 s only bounds a broken start.
	if !s.ReadyForConnections(30 * time.Second) {
		s.Shutdown()
		t.Fatal("natstest: server not ready for connections")
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s, s.ClientURL()
}

// Connect connects to url with opts and closes the connection on t.Cleanup.
func Connect(t testing.TB, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("natstest: connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}
