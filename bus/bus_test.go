package bus

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/internal/natstest"
)

func newJS(t *testing.T) (jetstream.JetStream, string) {
	t.Helper()
	_, url := natstest.Run(t)
	js, err := jetstream.New(natstest.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	return js, url
}

func TestEnsureStreams(t *testing.T) {
	js, _ := newJS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := EnsureStreams(ctx, js); err != nil {
		t.Fatal(err)
	}
	// A second call asking another limit keeps the existing one, which may
	// be an operator's, and reports the difference.
	findings, err := ReconcileStreams(ctx, js, WithMaxAge(48*time.Hour))
	if err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	if len(findings) != 2 || findings[0].Field != "max_age" || findings[0].Changed || findings[0].Level() != slog.LevelWarn {
		t.Fatalf("findings = %v, want max_age kept on both streams, as warnings", findings)
	}
	in, err := js.Stream(ctx, StreamIn)
	if err != nil {
		t.Fatal(err)
	}
	if n := PartitionsOf(in.CachedInfo().Config); n != DefaultPartitions {
		t.Errorf("CTX_IN has %d partitions, want %d", n, DefaultPartitions)
	}
	tests := []struct {
		name    string
		subject string
	}{
		{StreamIn, "ctx.in.*.* ctx.in.*.*.*"},
		{StreamEvents, "ctx.events.>"},
		{StreamState, "ctx.state.>"},
	}
	for _, tt := range tests {
		s, err := js.Stream(ctx, tt.name)
		if err != nil {
			t.Fatalf("stream %s: %v", tt.name, err)
		}
		cfg := s.CachedInfo().Config
		if got := strings.Join(cfg.Subjects, " "); got != tt.subject {
			t.Errorf("%s subjects = %v, want [%s]", tt.name, cfg.Subjects, tt.subject)
		}
		if cfg.Storage != jetstream.FileStorage || cfg.Duplicates != 2*time.Minute ||
			cfg.Retention != jetstream.LimitsPolicy || cfg.Discard != jetstream.DiscardOld ||
			cfg.MaxMsgSize != MaxMsgSize || cfg.Replicas != 1 || cfg.MaxAge != 0 {
			t.Errorf("%s config = %+v", tt.name, cfg)
		}
	}
}

// A stream made with another N keeps it. Asked for another N, that is a
// warning; with the default, information only: a stream created when the
// default was 64 is not an operator's mistake.
func TestExistingPartitionsAreKept(t *testing.T) {
	js, _ := newJS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := EnsureStreams(ctx, js, WithPartitions(64)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		opts  []Option
		level slog.Level
	}{
		{nil, slog.LevelInfo},
		{[]Option{WithPartitions(DefaultPartitions)}, slog.LevelWarn},
		{[]Option{WithPartitions(32)}, slog.LevelWarn},
	} {
		findings, err := ReconcileStreams(ctx, js, tc.opts...)
		if err != nil {
			t.Fatalf("reconcile: %v", err)
		}
		var got []Finding
		for _, f := range findings {
			if f.Field == "partitions" {
				got = append(got, f)
			}
		}
		if len(got) != 1 || got[0].Changed || got[0].Have != "64" || got[0].Level() != tc.level {
			t.Fatalf("%d options: partition findings %v, want 64 kept at level %v", len(tc.opts), got, tc.level)
		}
	}
	in, err := js.Stream(ctx, StreamIn)
	if err != nil {
		t.Fatal(err)
	}
	if n := PartitionsOf(in.CachedInfo().Config); n != 64 {
		t.Fatalf("CTX_IN has %d partitions, want the 64 it was made with", n)
	}
}

func TestReplicasOption(t *testing.T) {
	if got := InStreamConfig(WithReplicas(3)).Replicas; got != 3 {
		t.Fatalf("replicas = %d, want 3", got)
	}
	if got := ProfilesConfig(WithReplicas(0)).Replicas; got != 1 {
		t.Fatalf("replicas with a zero option = %d, want the default 1", got)
	}
}

func TestEnsureProfiles(t *testing.T) {
	js, _ := newJS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := EnsureProfiles(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 7 {
		if _, err := kv.Put(ctx, "default", []byte{byte('0' + i)}); err != nil {
			t.Fatal(err)
		}
	}
	hist, err := kv.History(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	if len(hist) != ProfilesHistory || string(hist[len(hist)-1].Value()) != "6" {
		t.Fatalf("history holds %d revisions ending %q, want %d ending \"6\"", len(hist), hist[len(hist)-1].Value(), ProfilesHistory)
	}
	// Idempotent: a second call opens the same bucket with its data.
	kv2, err := EnsureProfiles(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	if e, err := kv2.Get(ctx, "default"); err != nil || string(e.Value()) != "6" {
		t.Fatalf("after re-ensure: %v", err)
	}
}

// The stream drops a copy of an input the same connection sends again
// (bus.MsgID): the same id from another connection (another tenant's
// client, or another process) or on another subject is another message,
// which the service judges by tenant and input id. Nobody but the sender can
// name its Nats-Msg-Id.
func TestPublishInputDeduplicates(t *testing.T) {
	js, url := newJS(t)
	other, err := jetstream.New(natstest.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := EnsureStreams(ctx, js); err != nil {
		t.Fatal(err)
	}
	const id = "0b6c7a9e-1d2f-4c3b-9a8e-7f6d5c4b3a21"
	tests := []struct {
		name    string
		js      jetstream.JetStream
		subject string
		id      string
		dup     bool
		seq     uint64
		wantErr error
	}{
		{"first", js, "ctx.in.c1.turn", id, false, 1, nil},
		{"same id again", js, "ctx.in.c1.turn", id, true, 1, nil},
		{"other id", js, "ctx.in.c1.turn", "1b6c7a9e-1d2f-4c3b-9a8e-7f6d5c4b3a21", false, 2, nil},
		{"same id, another connection", other, "ctx.in.c1.turn", id, false, 3, nil},
		{"same id, another subject", js, "ctx.in.acme.c1.turn", id, false, 4, nil},
		{"not an input", js, "ctx.events.c1.rewind", id, false, 0, ErrNotInput},
		{"a '*' token", js, "ctx.in.*.turn", id, false, 0, ErrNotInput},
		{"a '>' token", js, "ctx.in.acme.>.turn", id, false, 0, ErrNotInput},
		{"an empty token", js, "ctx.in.acme..turn", id, false, 0, ErrNotInput},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ack, err := PublishInput(ctx, tt.js, tt.subject, tt.id, []byte(`{"id":"x"}`))
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ack.Duplicate != tt.dup || ack.Sequence != tt.seq || ack.Stream != StreamIn {
				t.Fatalf("ack = %+v, want duplicate=%v seq=%d", ack, tt.dup, tt.seq)
			}
		})
	}
	s, _ := js.Stream(ctx, StreamIn)
	m, err := s.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	got := m.Header.Get(jetstream.MsgIDHeader)
	if want := MsgID(js.Conn(), "ctx.in.c1.turn", id); got != want {
		t.Fatalf("Nats-Msg-Id = %q, want %q", got, want)
	}
	if !strings.HasPrefix(got, id+"/") || got == MsgID(other.Conn(), "ctx.in.c1.turn", id) {
		t.Fatalf("Nats-Msg-Id %q: not the id with a part of the connection's own", got)
	}
}

func TestConnConfigFlagsAndEnv(t *testing.T) {
	t.Setenv("NATS_URL", "nats://env:4222")
	t.Setenv("NATS_USER", "agent")
	t.Setenv("NATS_PASSWORD", "")
	t.Setenv("NATS_TOKEN", "")
	t.Setenv("NATS_CREDS", "")
	t.Setenv("NATS_NKEY", "")
	var c ConnConfig
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	c.RegisterFlags(fs)
	if err := fs.Parse([]string{"--nats-password", "pw"}); err != nil {
		t.Fatal(err)
	}
	if c.URL != "nats://env:4222" || c.User != "agent" || c.Password != "pw" {
		t.Fatalf("config = %+v", c)
	}
}

func TestConnConfigOptions(t *testing.T) {
	tests := []struct {
		name    string
		cfg     ConnConfig
		wantErr bool
	}{
		{"none", ConnConfig{}, false},
		{"user", ConnConfig{User: "u", Password: "p"}, false},
		{"token", ConnConfig{Token: "t"}, false},
		{"two methods", ConnConfig{User: "u", Token: "t"}, true},
		{"missing nkey file", ConnConfig{NKeyFile: "/nonexistent/seed.nk"}, true},
	}
	for _, tt := range tests {
		if _, err := tt.cfg.Options(); (err != nil) != tt.wantErr {
			t.Errorf("%s: err = %v, want error %v", tt.name, err, tt.wantErr)
		}
	}
}

func TestConnect(t *testing.T) {
	_, url := natstest.Run(t)
	nc, err := Connect(ConnConfig{URL: url, Name: "bus-test"})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if !nc.IsConnected() || nc.Opts.Name != "bus-test" || nc.Opts.MaxReconnect != -1 {
		t.Fatalf("connected=%v opts=%+v", nc.IsConnected(), nc.Opts)
	}
	if _, err := Connect(ConnConfig{URL: "nats://user:secret@127.0.0.1:1"}); err == nil {
		t.Fatal("connect to a closed port succeeded")
	} else if s := err.Error(); strings.Contains(s, "secret") {
		t.Fatalf("error leaks the password: %s", s)
	}
}

func TestRedact(t *testing.T) {
	tests := map[string]string{
		"nats://127.0.0.1:4222":      "nats://127.0.0.1:4222",
		"nats://u:p@h:1,nats://h2:2": "nats://***@h:1,nats://h2:2",
		"tls://token@h:1":            "tls://***@h:1",
		"localhost":                  "localhost",
	}
	for in, want := range tests {
		if got := redact(in); got != want {
			t.Errorf("redact(%q) = %q, want %q", in, got, want)
		}
	}
}

// A publisher cannot choose its partition: a subject in the stored form
// (ctx.in.<p>.<tenant>.<conv>.<kind>) or any other shape is not accepted by
// CTX_IN at all, and a tenant named like a partition number is stored under
// the partition the server computes for it, with its tenant kept.
func TestForgedPartitionSubjectIsNotStored(t *testing.T) {
	js, _ := newJS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := EnsureStreams(ctx, js, WithPartitions(8)); err != nil {
		t.Fatal(err)
	}
	for _, subject := range []string{
		"ctx.in.3.acme.c1.turn", // the stored form, partition chosen by the publisher
		"ctx.in.8.acme.c1.turn", // the shared partition's number
		"ctx.in.c1",             // too short
		"ctx.in.a.b.c.d.e",      // too long
	} {
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := js.Publish(pctx, subject, []byte(`{}`))
		pcancel()
		if err == nil {
			t.Errorf("%s: stored, want no stream to take it", subject)
		}
	}
	ack, err := js.Publish(ctx, "ctx.in.3.c1.turn", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, StreamIn)
	if err != nil {
		t.Fatal(err)
	}
	if n := s.CachedInfo().State.Msgs; n != 1 {
		t.Fatalf("CTX_IN holds %d messages, want 1", n)
	}
	m, err := s.GetMsg(ctx, ack.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	p, published, ok := SplitInputSubject(m.Subject, 8)
	if !ok || published != "ctx.in.3.c1.turn" || p < 0 || p >= 8 {
		t.Fatalf("stored as %q: partition %d, published %q, ok %v", m.Subject, p, published, ok)
	}
}

// PartitionOf computes what the server's partition(N,1,2) transform does:
// for many tenants and conversations, published through CTX_IN and read
// back, the stored subject's partition is PartitionOf's.
func TestPartitionOfAgreesWithTheServer(t *testing.T) {
	js, _ := newJS(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 48
	if err := EnsureStreams(ctx, js, WithPartitions(n)); err != nil {
		t.Fatal(err)
	}
	type key struct{ tenant, conv string }
	var keys []key
	for i := range 600 {
		tenant := []string{"acme", "globex", "t-9", "a", "tenant-with-a-long-name"}[i%5]
		conv := fmt.Sprintf("conv-%d-%x", i, i*7919)
		if i%7 == 0 {
			conv = uuid.NewString()
		}
		keys = append(keys, key{tenant, conv})
	}
	var futures []jetstream.PubAckFuture
	for _, k := range keys {
		f, err := js.PublishAsync("ctx.in."+k.tenant+"."+k.conv+".turn", []byte(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		futures = append(futures, f)
	}
	s, err := js.Stream(ctx, StreamIn)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for i, f := range futures {
		var seq uint64
		select {
		case ack := <-f.Ok():
			seq = ack.Sequence
		case err := <-f.Err():
			t.Fatal(err)
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		p, _, ok := SplitInputSubject(m.Subject, n)
		if want := PartitionOf(keys[i].tenant, keys[i].conv, n); !ok || p != want {
			t.Fatalf("%s.%s stored as %s (partition %d), PartitionOf says %d", keys[i].tenant, keys[i].conv, m.Subject, p, want)
		}
		seen[p] = true
	}
	if len(seen) < n {
		t.Fatalf("the keys reached %d of %d partitions", len(seen), n)
	}
	if p := PartitionOf("", "c1", n); p != n {
		t.Fatalf("no tenant: partition %d, want the shared one, %d", p, n)
	}
}

// CTX_IN takes atomic batches; one made before it did is given them, one
// that persists asynchronously (which cannot have them) is kept so.
func TestAtomicPublishIsReconciled(t *testing.T) {
	js, _ := newJS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	old := InStreamConfig()
	old.AllowAtomicPublish = false
	if _, err := js.CreateStream(ctx, old); err != nil {
		t.Fatal(err)
	}
	findings, err := ReconcileStreams(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	if len(findings) == 0 || findings[0].Field != "allow_atomic" || !findings[0].Changed {
		t.Fatalf("findings %v, want allow_atomic set on CTX_IN", findings)
	}
	in, err := js.Stream(ctx, StreamIn)
	if err != nil {
		t.Fatal(err)
	}
	if !in.CachedInfo().Config.AllowAtomicPublish {
		t.Fatal("CTX_IN still takes no atomic batches")
	}
	if findings, _ := ReconcileStreams(ctx, js); len(findings) != 0 {
		t.Fatalf("a second reconcile found %v", findings)
	}

	js2, _ := newJS(t)
	async := InStreamConfig()
	async.AllowAtomicPublish, async.PersistMode = false, jetstream.AsyncPersistMode
	if _, err := js2.CreateStream(ctx, async); err != nil {
		t.Fatal(err)
	}
	findings, err = ReconcileStreams(ctx, js2)
	if err != nil {
		t.Fatal(err)
	}
	if len(findings) == 0 || findings[0].Field != "allow_atomic" || findings[0].Changed {
		t.Fatalf("findings %v, want allow_atomic kept off on an asynchronous CTX_IN", findings)
	}
}

// CTX_IN and CTX_STATE are asked what they hold, which a replica answering
// a direct get may not hold yet: a stream made with direct gets has them
// taken off, and CTX_EVENTS, read far more than written, keeps them.
func TestDirectGetsAreReconciledOff(t *testing.T) {
	js, _ := newJS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, c := range []jetstream.StreamConfig{InStreamConfig(), StateStreamConfig()} {
		c.AllowDirect = true
		if _, err := js.CreateStream(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	findings, err := ReconcileStreams(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	changed := map[string]bool{}
	for _, f := range findings {
		if f.Field == "allow_direct" && f.Changed {
			changed[strings.TrimPrefix(f.Resource, "stream ")] = true
		}
	}
	for _, name := range []string{StreamIn, StreamState} {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if s.CachedInfo().Config.AllowDirect || !changed[name] {
			t.Fatalf("%s: direct gets %v, reconciled %v (findings %v); want them taken off",
				name, s.CachedInfo().Config.AllowDirect, changed[name], findings)
		}
	}
	ev, err := js.Stream(ctx, StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	if !ev.CachedInfo().Config.AllowDirect {
		t.Fatal("CTX_EVENTS lost its direct gets")
	}
}
