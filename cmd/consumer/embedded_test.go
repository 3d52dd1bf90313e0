package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
)

// startEmbeddedT starts the embedded server and the service's connection
// on dataDir, listening on a random loopback port, and stops both when the
// test ends.
func startEmbeddedT(t *testing.T, dataDir string) *Main {
	t.Helper()
	m := NewMain()
	m.Config.DataDir, m.Config.Listen = dataDir, "127.0.0.1:-1"
	m.Log = testLogger(t)
	if err := m.startEmbedded(); err != nil {
		t.Fatalf("start embedded: %v", err)
	}
	t.Cleanup(func() {
		m.nc.Close()
		m.ns.Shutdown()
		m.ns.WaitForShutdown()
	})
	return m
}

// The embedded server is nats.conf: it refuses whoever nats.conf refuses,
// the service reaches its streams as ctxpipe, and a tenant's input lands
// with the tenant in its subject.
func TestEmbeddedServerUsesNATSConf(t *testing.T) {
	dir := t.TempDir()
	m := startEmbeddedT(t, dir)
	url := m.ns.ClientURL()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	if nc, err := nats.Connect(url); !errors.Is(err, nats.ErrAuthorization) {
		if nc != nil {
			nc.Close()
		}
		t.Fatalf("an unauthenticated client connected (err %v)", err)
	}
	if nc, err := nats.Connect(url, nats.UserInfo(ServiceUser, "wrong")); !errors.Is(err, nats.ErrAuthorization) {
		if nc != nil {
			nc.Close()
		}
		t.Fatalf("ctxpipe connected with a wrong password (err %v)", err)
	}

	// The service's in-process connection is ctxpipe in account CTX, with
	// its own inbox prefix.
	if got := m.nc.Opts.User; got != ServiceUser {
		t.Fatalf("the service connected as %q", got)
	}
	if got := m.nc.ConnectedUrl(); got != url {
		t.Fatalf("the service's connection says it is on %s, the server listens on %s", got, url)
	}
	if got := m.nc.Opts.InboxPrefix; got != "_INBOX_"+ServiceUser {
		t.Fatalf("the service's inbox prefix is %q", got)
	}
	svc, err := jetstream.New(m.nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := bus.EnsureStreams(ctx, svc); err != nil {
		t.Fatalf("ctxpipe creates the streams: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "nats", "jetstream", "CTX", "streams", bus.StreamIn)); err != nil {
		t.Fatalf("CTX_IN is not stored under --data-dir: %v", err)
	}

	agentCfg := bus.ConnConfig{URL: url, User: "acme-agent", Password: "acme-agent-demo-password",
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	violations := make(chan error, 16)
	agent, err := bus.Connect(agentCfg, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { violations <- err }))
	if err != nil {
		t.Fatalf("acme-agent: %v", err)
	}
	defer agent.Close()
	ajs, err := jetstream.New(agent)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bus.PublishInput(ctx, ajs, "ctx.in.c1.turn", uuid.NewString(), []byte(`{"from":"acme"}`)); err != nil {
		t.Fatalf("acme-agent publishes a turn: %v", err)
	}
	in, err := svc.Stream(ctx, bus.StreamIn)
	if err != nil {
		t.Fatal(err)
	}
	// Stored under its partition: ctx.in.<p>.acme.c1.turn.
	if msg, err := in.GetLastMsgForSubject(ctx, "ctx.in.*.acme.c1.turn"); err != nil || string(msg.Data) != `{"from":"acme"}` {
		t.Fatalf("acme's turn is not in CTX_IN as ctx.in.<p>.acme.c1.turn: %v", err)
	}
	// And the permissions hold: an agent does not read events.
	if _, err := agent.SubscribeSync("ctx.events.>"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-violations:
		if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), `"ctx.events.>"`) {
			t.Fatalf("acme-agent: %v", err)
		}
	case <-time.After(10 * time.Second): // bounds a failure only: the refusal is immediate
		t.Fatal("acme-agent subscribed to ctx.events.> unrefused")
	}
}

func TestEmbeddedOptions(t *testing.T) {
	opts, err := embeddedOptions("/data", "127.0.0.1:4222")
	if err != nil {
		t.Fatal(err)
	}
	if opts.ServerName != "ctxpipe-embedded" || opts.StoreDir != filepath.Join("/data", "nats") || !opts.JetStream ||
		opts.HTTPPort != 0 || opts.Host != "127.0.0.1" || opts.Port != 4222 || opts.DontListen {
		t.Fatalf("options: name %q store %q jetstream %v http %d listen %s:%d (dont %v)",
			opts.ServerName, opts.StoreDir, opts.JetStream, opts.HTTPPort, opts.Host, opts.Port, opts.DontListen)
	}
	if opts.MaxPayload < bus.MaxMsgSize {
		t.Fatalf("max payload %d < %d", opts.MaxPayload, bus.MaxMsgSize)
	}
	var users []string
	for _, u := range opts.Users {
		users = append(users, u.Account.Name+"/"+u.Username)
	}
	slices.Sort(users)
	want := []string{"ACME/acme-agent", "ACME/acme-ui", "ADMIN/admin", "CTX/ctxpipe", "GLOBEX/globex-agent", "GLOBEX/globex-ui"}
	if !slices.Equal(users, want) {
		t.Fatalf("users %v, want %v", users, want)
	}

	for _, tt := range []struct {
		listen string
		ok     bool
	}{
		{"", true}, // in-process clients only
		{"127.0.0.1:-1", true},
		{"127.0.0.2:4222", true},
		{"[::1]:4222", true},
		{"localhost:4222", true},
		{":4222", false}, // every interface
		{"0.0.0.0:4222", false},
		{"[::]:4222", false},
		{"192.168.1.10:4222", false},
		{"example.com:4222", false},
		{"127.0.0.1", false},
		{"127.0.0.1:port", false},
	} {
		opts, err := embeddedOptions(t.TempDir(), tt.listen)
		if (err == nil) != tt.ok {
			t.Errorf("--listen %q: err %v, want ok %v", tt.listen, err, tt.ok)
		}
		if err == nil && opts.DontListen != (tt.listen == "") {
			t.Errorf("--listen %q: DontListen %v", tt.listen, opts.DontListen)
		}
	}
}

func TestServicePassword(t *testing.T) {
	opts, err := embeddedOptions(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	if pw, err := servicePassword(opts, ""); err != nil || pw != "ctxpipe-demo-password" {
		t.Fatalf("nats.conf's password: %q, %v", pw, err)
	}
	if pw, err := servicePassword(opts, "from-flag"); err != nil || pw != "from-flag" {
		t.Fatalf("--nats-password: %q, %v", pw, err)
	}
	hashed := &server.Options{Users: []*server.User{{Username: ServiceUser, Password: "$2a$11$abcdefghijklmnopqrstuv"}}}
	if _, err := servicePassword(hashed, ""); err == nil || !strings.Contains(err.Error(), "--nats-password") {
		t.Fatalf("a bcrypt hash: %v, want an error naming --nats-password", err)
	}
	if _, err := servicePassword(&server.Options{}, ""); err == nil {
		t.Fatal("no ctxpipe user: no error")
	}
}
