// Command barejs is the anchor of BenchmarkEndToEnd's load figure: NATS
// JetStream alone, in a process of its own as the service's embedded server
// is, with CTX_IN configured as the service configures it and one consumer
// that acks every message as soon as it arrives. Whatever rate the publisher
// reaches through it is the most the service could reach on the machine
// that runs both.
//
// It prints "ready" once the stream is there, then, when it has acked -n
// messages, "acked N from FIRST to LAST" (Unix nanoseconds: the first
// message's arrival and the last ack) and exits.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:4222", "client address")
	n := flag.Int("n", 10000, "messages to ack before exiting")
	flag.Parse()
	if err := run(*listen, *n); err != nil {
		fmt.Fprintln(os.Stderr, "barejs:", err)
		os.Exit(1)
	}
}

func run(listen string, n int) error {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "barejs")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	s, err := server.NewServer(&server.Options{Host: host, Port: p, JetStream: true, StoreDir: dir,
		MaxPayload: 8 << 20, NoLog: true, NoSigs: true})
	if err != nil {
		return err
	}
	s.Start()
	defer s.Shutdown()
	if !s.ReadyForConnections(30 * time.Second) {
		return fmt.Errorf("server not ready")
	}
	nc, err := nats.Connect("", nats.InProcessServer(s))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx := context.Background()
	if err := bus.EnsureStreams(ctx, js); err != nil {
		return err
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, bus.StreamIn, jetstream.ConsumerConfig{
		Durable: "bare", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 64 * 256})
	if err != nil {
		return err
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(2048))
	if err != nil {
		return err
	}
	defer it.Stop()
	fmt.Println("ready")
	var first time.Time
	for i := 0; i < n; i++ {
		msg, err := it.Next()
		if err != nil {
			return err
		}
		if i == 0 {
			first = time.Now()
		}
		if err := msg.Ack(); err != nil {
			return err
		}
	}
	fmt.Printf("acked %d from %d to %d\n", n, first.UnixNano(), time.Now().UnixNano())
	return nil
}
