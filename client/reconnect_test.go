package client_test

import (
	"io"
	"net"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ctxpipe/ctxpipe/client"
	"github.com/ctxpipe/ctxpipe/client/clienttest"
	"github.com/ctxpipe/ctxpipe/internal/natstest"
	"github.com/ctxpipe/ctxpipe/schema"
)

// cutter is a TCP proxy to a NATS server whose connections a test can cut:
// the client sees the server go away and come back, while the server and
// the service keep running.
type cutter struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	down   bool
	conns  []net.Conn
}

// cutRig is the service, a client connected to it directly (the writer)
// and one connected through a cutter (the reader, reconnecting every wait
// while the cutter lets it).
type cutRig struct {
	svc            *clienttest.Service
	writer, reader *client.Client
	nc             *nats.Conn // the reader's
	proxy          *cutter
}

func newCutRig(t *testing.T, wait time.Duration) cutRig {
	t.Helper()
	svc := clienttest.New(t)
	writer, err := client.New(natstest.Connect(t, svc.URL))
	if err != nil {
		t.Fatal(err)
	}
	proxy := newCutter(t, svc.URL)
	nc := natstest.Connect(t, proxy.url(), nats.MaxReconnects(-1), nats.ReconnectWait(wait))
	reader, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return cutRig{svc: svc, writer: writer, reader: reader, nc: nc, proxy: proxy}
}

func newCutter(t *testing.T, natsURL string) *cutter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutter{ln: ln, target: strings.TrimPrefix(natsURL, "nats://")}
	t.Cleanup(func() { ln.Close(); p.cut() })
	go p.serve()
	return p
}

func (p *cutter) url() string { return "nats://" + p.ln.Addr().String() }

func (p *cutter) serve() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.down {
			p.mu.Unlock()
			in.Close()
			continue
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			in.Close()
			continue
		}
		p.conns = append(p.conns, in, out)
		p.mu.Unlock()
		go func() { _, _ = io.Copy(out, in); out.Close() }()
		go func() { _, _ = io.Copy(in, out); in.Close() }()
	}
}

// cut closes every proxied connection and refuses new ones until restore.
func (p *cutter) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *cutter) restore() {
	p.mu.Lock()
	p.down = false
	p.mu.Unlock()
}

// Events published while a replaying stream's connection is down are read
// back from the service once it is up again: no gap, no duplicate.
func TestEventsReadBackAfterReconnect(t *testing.T) {
	rig := newCutRig(t, 50*time.Millisecond)
	svc, writer, reader, nc, proxy := rig.svc, rig.writer, rig.reader, rig.nc, rig.proxy
	ctx := t.Context()
	const conv = "reconnect"
	s, err := reader.Events(ctx, conv, client.Replay(0))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	first := appendTurns(ctx, writer, conv, 10) // one condense
	collect(t, s, first, schema.EventCondenseContext)

	proxy.cut()
	// While the reader is away: another condense, and a rejection.
	manual, err := writer.Condense(ctx, conv, "")
	if err != nil {
		t.Fatal(err)
	}
	bad, err := writer.Append(ctx, schema.Turn{ConversationID: conv, Role: "robot", Content: schema.TextContent("x")})
	if err != nil {
		t.Fatal(err)
	}
	if err := writer.Wait(ctx, conv, manual); err != nil {
		t.Fatal(err)
	}
	if err := writer.Wait(ctx, conv, bad); err == nil {
		t.Fatal("the bad turn was applied")
	}
	if err := svc.Flush(ctx); err != nil { // published while nobody listened through the proxy
		t.Fatal(err)
	}
	if nc.IsConnected() {
		t.Fatal("the reader is still connected")
	}
	proxy.restore()
	got := collect(t, s, bad, schema.EventInputRejected)
	want := stored(t, svc, conv)
	var all []string
	// What the stream delivered before the cut, then after it.
	for i, id := range want {
		if id == got[0].Header().ID {
			all = append(want[:i:i], ids(got)...)
			break
		}
	}
	if !reflect.DeepEqual(all, want) || len(got) < 3 {
		t.Fatalf("after the reconnect %d events:\n%v\nstored:\n%v", len(got), ids(got), want)
	}
}
