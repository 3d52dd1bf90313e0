package main

import (
	"context"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
)

// BenchmarkIngest splits the cost of getting a turn into CTX_IN, with no
// consumer running, into the steps a tenant's publish goes through: the
// same small turns, published asynchronously over TCP with a bounded window
// of pending acks, into one in-process server per variant:
//
//   - bare: a server without accounts, CTX_IN as the service creates it,
//     published as ctx.in.<conv>.turn (no partition transform applies to
//     four tokens). The anchor.
//   - transform: the same server, published as ctx.in.acme.<conv>.turn, so
//     the stream's partition transform applies.
//   - tenant: nats.conf's server as acme-agent, publishing ctx.in.<conv>.turn:
//     the service import into CTX (one tracked response per publish) too.
//   - tenant-no-msgid: the same without Nats-Msg-Id (no dedup window lookup).
//
// Each variant reports turns/s and the process's CPU (server and publisher
// together: both are in this process) per turn, and the ratio of both to
// bare from the same run: the steps a tenant adds are what differ.
func BenchmarkIngest(b *testing.B) {
	const turns, convs = 20000, 50
	payload := []byte(`{"id":"00000000-0000-0000-0000-000000000000","role":"user","content":"run the failing test again and show me the first error line please","ts":1750000000000}`)
	type variant struct {
		name     string
		conf     bool
		user     string
		subject  func(conv string) string
		withID   bool
		anchored bool
	}
	plain := func(conv string) string { return "ctx.in." + conv + ".turn" }
	tenant := func(conv string) string { return "ctx.in.acme." + conv + ".turn" }
	variants := []variant{
		{name: "bare", subject: plain, withID: true, anchored: true},
		{name: "transform", subject: tenant, withID: true},
		{name: "tenant", conf: true, user: "acme-agent", subject: plain, withID: true},
		{name: "tenant-no-msgid", conf: true, user: "acme-agent", subject: plain},
	}
	var bareRate, bareCPU float64
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				url, service := ingestServer(b, v.conf)
				nc, js := ingestConnect(b, url, v.user)
				b.StartTimer()
				rate, cpu := publishIngest(b, js, service, turns, convs, payload, v.subject, v.withID)
				b.StopTimer()
				nc.Close()
				b.ReportMetric(rate, "turns/s")
				b.ReportMetric(cpu, "cpu-µs/turn")
				if v.anchored {
					bareRate, bareCPU = rate, cpu
				} else if bareRate > 0 {
					b.ReportMetric(rate/bareRate, "rate/bare")
					b.ReportMetric(cpu/bareCPU, "cpu/bare")
				}
			}
		})
	}
}

// ingestServer starts a server on a random loopback port: nats.conf's
// accounts and users when conf, else none; either way with CTX_IN created
// as the service creates it. It returns the client URL and the service's
// own JetStream context.
func ingestServer(b *testing.B, conf bool) (string, jetstream.JetStream) {
	b.Helper()
	var opts *server.Options
	if conf {
		o, err := embeddedOptions(b.TempDir(), "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		opts = o
	} else {
		opts = &server.Options{Host: "127.0.0.1", JetStream: true, StoreDir: b.TempDir(), MaxPayload: 8 << 20}
	}
	opts.Port = -1
	opts.NoLog, opts.NoSigs = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		b.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		b.Fatal("server not ready")
	}
	b.Cleanup(s.Shutdown)
	user := ""
	if conf {
		user = ServiceUser
	}
	_, js := ingestConnect(b, s.ClientURL(), user)
	if err := bus.EnsureStreams(context.Background(), js); err != nil {
		b.Fatal(err)
	}
	return s.ClientURL(), js
}

// ingestConnect connects as user, with nats.conf's demo password for it.
func ingestConnect(b *testing.B, url, user string) (*nats.Conn, jetstream.JetStream) {
	b.Helper()
	var opts []nats.Option
	switch user {
	case "":
	case ServiceUser:
		opts = append(opts, nats.UserInfo(user, "ctxpipe-demo-password"))
	default:
		opts = append(opts, nats.UserInfo(user, user+"-demo-password"), nats.CustomInboxPrefix("_INBOX_"+user))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(256))
	if err != nil {
		b.Fatal(err)
	}
	return nc, js
}

// publishIngest publishes n turns round-robin over convs conversations with at
// most 256 acks pending, waits for every ack, and returns the rate and the
// process CPU per turn. service checks that CTX_IN holds them all.
func publishIngest(b *testing.B, js, service jetstream.JetStream, n, convs int, payload []byte, subject func(string) string, withID bool) (rate, cpuPerTurn float64) {
	b.Helper()
	cpu0 := processCPU(b)
	start := time.Now()
	for i := range n {
		var opts []jetstream.PublishOpt
		if withID {
			opts = append(opts, jetstream.WithMsgID("turn-"+strconv.Itoa(i)))
		}
		if _, err := js.PublishAsync(subject("c"+strconv.Itoa(i%convs)), payload, opts...); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Fatal("acks did not all arrive within a minute")
	}
	elapsed := time.Since(start)
	info, err := service.Stream(context.Background(), bus.StreamIn)
	if err != nil {
		b.Fatal(err)
	}
	if got := info.CachedInfo().State.Msgs; got != uint64(n) {
		b.Fatalf("CTX_IN holds %d messages, want %d", got, n)
	}
	return float64(n) / elapsed.Seconds(), (processCPU(b) - cpu0).Seconds() * 1e6 / float64(n)
}

// processCPU is the user and system CPU this process used so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
