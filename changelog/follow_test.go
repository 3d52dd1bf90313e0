package changelog_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/changelog"
	"github.com/ctxpipe/ctxpipe/internal/natstest"
)

// A live follower on a 3-node cluster reads every record another writer
// appends, whichever replica serves its consumer. A replica can deliver a
// message before the stream leader has stored it; a follower that took
// only the headers from its consumer and fetched the data from the leader
// was answered 404 then (seen early in a run: "read 87: message not
// found"), and started over.
func TestFollowLiveReadsEveryRecordOnACluster(t *testing.T) {
	ctx := context.Background()
	c := natstest.RunCluster(t)
	js, err := jetstream.New(natstest.Connect(t, c.URL()))
	if err != nil {
		t.Fatal(err)
	}
	ensureR3(t, js)
	// The first append of a young stream can find no leader yet.
	c.WaitStreamLeader(bus.StreamState)
	const records, followers = 1500, 6
	type result struct {
		n   int
		err error
	}
	results := make(chan result, followers)
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for i := range followers {
		fjs, err := jetstream.New(natstest.Connect(t, c.URLs()[i%natstest.ClusterSize]))
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			items := make(chan changelog.Item)
			errc := make(chan error, 1)
			go func() { errc <- changelog.FollowLive(fctx, fjs, nil, 1, true, nil, items) }()
			n, starts := 0, 1
			for {
				select {
				case err := <-errc:
					if n == 0 && starts < 3 {
						// Not started (a request lost while the cluster
						// settles): start again, as the service does.
						starts++
						go func() { errc <- changelog.FollowLive(fctx, fjs, nil, 1, true, nil, items) }()
						continue
					}
					results <- result{n, err}
					return
				case it := <-items:
					switch {
					case it.Err != nil:
						results <- result{n, fmt.Errorf("item %d: %w", it.Seq, it.Err)}
						return
					case it.Record == nil || it.Seq != uint64(n+1):
						results <- result{n, fmt.Errorf("item %d after %d records: %+v", it.Seq, n, it)}
						return
					}
					if n++; n == records {
						results <- result{n, nil}
						return
					}
				}
			}
		}()
	}
	l := &changelog.Log{JS: js}
	var after uint64
	for i := range records {
		data, err := changelog.Encode(changelog.Record{Partition: 1, At: int64(i)})
		if err != nil {
			t.Fatal(err)
		}
		if after, err = appendOnce(ctx, l, js, after, data); err != nil {
			t.Fatal(err)
		}
	}
	for range followers {
		select {
		case r := <-results:
			if r.err != nil {
				t.Errorf("a follower stopped after %d of %d records: %v", r.n, records, r.err)
			}
		case <-time.After(time.Minute):
			t.Fatal("a follower did not read every record within a minute")
		}
	}
}

// A live follower hands on every message in order, with its record exactly
// when the instance lacks it, as it switches between reading headers only
// (while it holds what comes) and reading data (from the first message it
// lacks until it has held a long run again).
func TestFollowLiveSwitchesBetweenHeadersAndData(t *testing.T) {
	ctx := context.Background()
	js := startState(t)
	const records = 1000
	lacks := func(seq uint64) bool { return (seq > 400 && seq < 420) || seq > 900 }
	l := &changelog.Log{JS: js}
	var after uint64
	for i := range records {
		data, err := changelog.Encode(changelog.Record{Partition: 2, At: int64(i)})
		if err != nil {
			t.Fatal(err)
		}
		if after, err = l.Append(ctx, 2, after, data); err != nil {
			t.Fatal(err)
		}
	}
	fctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	items := make(chan changelog.Item)
	go func() {
		_ = changelog.FollowLive(fctx, js, nil, 1, true, func(_ int, seq uint64) bool { return !lacks(seq) }, items)
	}()
	for seq := uint64(1); seq <= records; seq++ {
		var it changelog.Item
		select {
		case it = <-items:
		case <-fctx.Done():
			t.Fatalf("no item %d", seq)
		}
		if it.Seq != seq || it.Err != nil || it.Partition != 2 || (it.Record != nil) != lacks(seq) {
			t.Fatalf("item %d: %+v (lacked: %v)", seq, it, lacks(seq))
		}
		if it.Record != nil && it.Record.At != int64(seq-1) {
			t.Fatalf("item %d holds record %d", seq, it.Record.At)
		}
	}
}

// Appends of a partition back to back, as a writer's overlapping rounds
// make them, all land on a 3-node cluster. A replicated stream answers the
// condition on the subject's last sequence with 10164 (undecided) while the
// subject's previous message is still being stored on the leader, although
// its writer has its acknowledgement; the append failed on it, and so did
// its batch.
func TestAppendsBackToBackOnACluster(t *testing.T) {
	ctx := context.Background()
	c := natstest.RunCluster(t)
	const writers, appends = 4, 1500
	errs := make(chan error, writers)
	for w := range writers {
		js, err := jetstream.New(natstest.Connect(t, c.URLs()[w%natstest.ClusterSize]))
		if err != nil {
			t.Fatal(err)
		}
		if w == 0 {
			ensureR3(t, js)
			// A stream just made may not answer its first publishes
			// ("no response from stream"): the writers start once it has
			// a leader and took one, on a partition none of them writes.
			c.WaitStreamLeader(bus.StreamState)
			if err := bus.RetryStart(ctx, slog.New(slog.DiscardHandler), "probe append", func(ctx context.Context) error {
				_, err := js.Publish(ctx, bus.StateSubject(writers), []byte("probe"), jetstream.WithMsgID("probe"))
				return err
			}); err != nil {
				t.Fatal(err)
			}
		}
		go func() {
			l := &changelog.Log{JS: js}
			var after uint64
			for i := range appends {
				data, err := changelog.Encode(changelog.Record{Partition: w, At: int64(i)})
				if err == nil {
					after, err = l.Append(ctx, w, after, data)
				}
				if err != nil {
					errs <- fmt.Errorf("writer %d, append %d: %w", w, i, err)
					return
				}
			}
			errs <- nil
		}()
	}
	for range writers {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// ensureR3 creates the streams at 3 replicas, retrying as the service does:
// a cluster just formed may lose the first requests.
// appendOnce appends data to partition 1 after sequence after, as the
// service's workers do: an append whose answer is lost (a loaded young
// cluster) is sent again, unless it was stored, which the partition's last
// message then says. The fence keeps it from being stored twice (a retry
// of a stored one is fenced, and the last message then says so).
func appendOnce(ctx context.Context, l *changelog.Log, js jetstream.JetStream, after uint64, data []byte) (uint64, error) {
	for deadline := time.Now().Add(30 * time.Second); ; {
		seq, err := l.Append(ctx, 1, after, data)
		lost := errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, changelog.ErrFenced)
		if err == nil || !lost || time.Now().After(deadline) {
			return seq, err
		}
		s, serr := js.Stream(ctx, bus.StreamState)
		if serr != nil {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if last, lerr := changelog.LastOf(ctx, s, 1); lerr == nil && last > after {
			return last, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func ensureR3(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	if err := bus.RetryStart(context.Background(), slog.New(slog.DiscardHandler), "ensure streams", func(ctx context.Context) error {
		return bus.EnsureStreams(ctx, js, bus.WithReplicas(3))
	}); err != nil {
		t.Fatal(err)
	}
}
