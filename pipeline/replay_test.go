package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/internal/natstest"
	"github.com/ctxpipe/ctxpipe/schema"
)

// errPlacement ends a read whose consumer shares its node with a leader.
var errPlacement = errors.New("the consumer's node leads the meta group or the stream")

// A takeover reads the inputs a dead owner held through a consumer of its
// own. When the node serving that consumer dies mid-read, the read goes on
// from the first input it has not handed on, within a couple of pull
// heartbeats, in stream order, each input once. With the library's default
// heartbeat it waited 10 s (two missed 5 s heartbeats) before going on, and
// a handover took that long.
func TestReadRangeGoesOnWhenItsNodeDies(t *testing.T) {
	ctx := context.Background()
	c := natstest.RunCluster(t)
	js, err := jetstream.New(natstest.Connect(t, c.URL()))
	if err != nil {
		t.Fatal(err)
	}
	const partitions, inputs = 4, 800
	// As the service does: a cluster just formed may lose the first requests.
	if err := bus.RetryStart(ctx, slog.New(slog.DiscardHandler), "ensure streams", func(ctx context.Context) error {
		return bus.EnsureStreams(ctx, js, bus.WithReplicas(3), bus.WithPartitions(partitions))
	}); err != nil {
		t.Fatal(err)
	}
	// Inputs without a tenant form the shared partition. A cluster just
	// formed may refuse the first publishes (a run once found the stream
	// empty, and its read waited for inputs that were never stored): each
	// refused one is published again, its id making a repeat a no-op.
	const subject = "ctx.in.c1.turn"
	futures := make([]jetstream.PubAckFuture, inputs)
	for i := range inputs {
		f, err := js.PublishAsync(subject, []byte(fmt.Sprint(i)), jetstream.WithMsgID(fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		futures[i] = f
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		t.Fatal("publishes not acknowledged")
	}
	for i, f := range futures {
		select {
		case <-f.Ok():
			continue
		case err := <-f.Err():
			t.Logf("publish %d refused (%v); publishing it again", i, err)
		}
		if err := bus.RetryStart(ctx, slog.New(slog.DiscardHandler), "publish", func(ctx context.Context) error {
			_, err := js.Publish(ctx, subject, []byte(fmt.Sprint(i)), jetstream.WithMsgID(fmt.Sprint(i)))
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	st, err := js.Stream(ctx, bus.StreamIn)
	if err != nil {
		t.Fatal(err)
	}
	if state := st.CachedInfo().State; state.LastSeq != inputs || state.Msgs != inputs {
		t.Fatalf("the stream holds %d messages up to %d, want sequences 1..%d", state.Msgs, state.LastSeq, inputs)
	}

	// The node to kill serves the read's consumer and leads neither the
	// meta group nor the stream: a new consumer needs both leaders, and an
	// election takes 4-9 s whatever the reader does. The consumer's node is
	// drawn by the server, so a read drawn onto a leader's node is ended
	// and a new one started.
	for attempt := 1; ; attempt++ {
		if attempt > 20 {
			t.Fatal("no read's consumer landed on a node that leads nothing")
		}
		var killed time.Time
		var got []uint64
		var refused error
		each := func(msg jetstream.Msg) {
			md, err := msg.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, md.Sequence.Stream)
			if !killed.IsZero() || refused != nil {
				return
			}
			host := c.ConsumerLeader(bus.StreamIn, md.Consumer)
			if host == "" || host == c.MetaLeader() || host == c.StreamLeader(bus.StreamIn) {
				refused = errPlacement
				return
			}
			c.KillByName(host)
			killed = time.Now()
		}
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		n, err := readRange(rctx, js, bus.PartitionFilter(partitions, partitions), 1, inputs, time.Second, each,
			func(next uint64, err error) {
				t.Logf("attempt %d: a try failed; reading on from %d: %v", attempt, next, err)
			})
		cancel()
		if refused != nil {
			continue
		}
		took := time.Since(killed)
		if err != nil {
			t.Fatalf("read %d inputs: %v", n, err)
		}
		if n != inputs || len(got) != inputs {
			t.Fatalf("read %d inputs (%d handed on), want %d", n, len(got), inputs)
		}
		for i, seq := range got {
			if seq != uint64(i+1) {
				t.Fatalf("input %d has sequence %d: not each once in stream order", i, seq)
			}
		}
		// Two missed heartbeats (500 ms each), then a new consumer, which
		// the server may place on the dead node while it still counts it
		// live (a creation that times out after takeoverStep, 2 s), with
		// room for a slow machine. The library's default heartbeat took
		// 10 s.
		if took > 6*time.Second {
			t.Fatalf("the read went on %v after its node was killed, want within 6s", took.Round(time.Millisecond))
		}
		t.Logf("the read ended %v after its node was killed (attempt %d)", took.Round(time.Millisecond), attempt)
		return
	}
}

// A read's last sequence is the consumer's delivered one, which need not
// be a message of the partition: past the partition's last input, the
// stream holds only other partitions'. The read ends with the partition's
// inputs, each once in stream order, without waiting for one it will never
// get (a read that ended only at its last sequence looped there).
func TestReadRangeEndsAtThePartitionsLastInput(t *testing.T) {
	ctx := context.Background()
	_, url := natstest.Run(t)
	js, err := jetstream.New(natstest.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	const partitions = 4
	if err := bus.EnsureStreams(ctx, js, bus.WithPartitions(partitions)); err != nil {
		t.Fatal(err)
	}
	// Two conversations of one tenant on different partitions: ours gets
	// sequences 1..10, the other 11..15.
	var ours, other string
	for i := 0; ours == "" || other == ""; i++ {
		conv := fmt.Sprintf("c%d", i)
		switch p := bus.PartitionOf("t", conv, partitions); {
		case p == 0 && ours == "":
			ours = conv
		case p != 0 && other == "":
			other = conv
		}
	}
	for i := range 15 {
		conv := ours
		if i >= 10 {
			conv = other
		}
		if _, err := js.Publish(ctx, schema.InputSubject(schema.ConversationKey("t", conv), schema.KindTurn), []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	filter := bus.PartitionFilter(0, partitions)
	// Past the stream's end (15) the leader cannot tell: not an answer.
	for _, c := range []struct {
		from, to   uint64
		want, fail bool
	}{{1, 15, true, false}, {10, 10, true, false}, {10, 15, true, false}, {11, 15, false, false},
		{11, 14, false, false}, {16, 40, false, true}, {5, 4, false, false}} {
		if got, err := holdsBetween(ctx, js, filter, c.from, c.to); (err != nil) != c.fail || got != c.want {
			t.Errorf("holdsBetween(%d, %d) = %v, %v; want %v, failing %v", c.from, c.to, got, err, c.want, c.fail)
		}
	}
	var got []uint64
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := readRange(rctx, js, filter, 1, 15, time.Second, func(msg jetstream.Msg) {
		md, _ := msg.Metadata()
		got = append(got, md.Sequence.Stream)
	}, func(next uint64, err error) { t.Logf("a try failed; reading on from %d: %v", next, err) })
	if err != nil || n != 10 || len(got) != 10 {
		t.Fatalf("read %d inputs (%d handed on): %v; want the partition's 10", n, len(got), err)
	}
	for i, seq := range got {
		if seq != uint64(i+1) {
			t.Fatalf("input %d has sequence %d: not each once in stream order", i, seq)
		}
	}

	// A range holding none of the partition's inputs: its consumer
	// delivers nothing, and after stallAfter the leader says nothing is to
	// come. The read ends, complete and empty, well before its context.
	t0 := time.Now()
	n, err = readRange(rctx, js, filter, 11, 15, time.Second, func(jetstream.Msg) { t.Error("an input was handed on") }, nil)
	if took := time.Since(t0); err != nil || n != 0 || took > stallAfter+2*time.Second {
		t.Fatalf("an empty range read %d inputs in %v: %v; want none, within %v", n, took, err, stallAfter+2*time.Second)
	}
}

// Whether a read is complete is decided from the leader's answers: a
// message past the read's last sequence proves its store holds everything
// before; no message at all proves nothing unless its store reaches that
// far (a leader just elected may not have applied its whole log yet).
func TestHoldsUpTo(t *testing.T) {
	for _, c := range []struct {
		first, last, to uint64
		more, fail      bool
	}{
		{first: 12, to: 15, more: true},
		{first: 15, to: 15, more: true},
		{first: 16, to: 15},
		{first: 0, last: 15, to: 15},
		{first: 0, last: 40, to: 15},
		{first: 0, last: 14, to: 15, fail: true},
		{first: 0, last: 0, to: 15, fail: true},
	} {
		more, err := holdsUpTo(c.first, c.last, c.to)
		if more != c.more || (err != nil) != c.fail {
			t.Errorf("holdsUpTo(%d, %d, %d) = %v, %v; want %v, failing %v", c.first, c.last, c.to, more, err, c.more, c.fail)
		}
	}
}
