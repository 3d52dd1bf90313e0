package natstest

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestRunHasJetStream(t *testing.T) {
	_, url := Run(t)
	nc := Connect(t, url)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}}); err != nil {
		t.Fatalf("create stream: %v", err)
	}
	big := make([]byte, 2<<20) // over the server's default 1 MiB payload
	ack, err := js.Publish(ctx, "t.big", big)
	if err != nil {
		t.Fatalf("publish 2 MiB: %v", err)
	}
	if ack.Sequence != 1 {
		t.Fatalf("sequence = %d, want 1", ack.Sequence)
	}
}

func TestRunWithConfigOverridesPortAndStore(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "t.conf")
	// A port and store dir that must both be overridden.
	err := os.WriteFile(conf, []byte(`
listen: 127.0.0.1:4
jetstream { store_dir: "/nonexistent/should-not-be-used" }
authorization { users = [ { user: a, password: b } ] }
`), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	s, url := RunWithConfig(t, conf)
	if s.Addr() == nil {
		t.Fatal("server has no listener")
	}
	if _, err := nats.Connect(url); err == nil {
		t.Fatal("connect without credentials succeeded, want an authorization error")
	}
	nc := Connect(t, url, nats.UserInfo("a", "b"))
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.AccountInfo(ctx); err != nil {
		t.Fatalf("JetStream not available: %v", err)
	}
}
