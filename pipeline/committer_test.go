package pipeline

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"

	"github.com/ctxpipe/ctxpipe/changelog"
	"github.com/ctxpipe/ctxpipe/store"
)

// The gathering rule: while a round is pending, a followed item of a
// partition the round appends to waits for its commit unless the store
// already reflects it; items of other partitions go through at once.
func TestCommitRoundWaits(t *testing.T) {
	next := &round{batches: []*partitionBatch{{partition: 1}, {partition: 3}}}
	applied := []uint64{0, 10, 0, 20}
	rec := &changelog.Record{Partition: 1}
	tests := []struct {
		name string
		it   changelog.Item
		want bool
	}{
		{"another partition's record", changelog.Item{Partition: 2, Seq: 30, Record: rec}, false},
		{"another partition's unknown message", changelog.Item{Partition: 0, Seq: 30}, false},
		{"a record of a partition the round appends to", changelog.Item{Partition: 1, Seq: 11, Record: rec}, true},
		{"even one the store reflects", changelog.Item{Partition: 1, Seq: 9, Record: rec}, true},
		{"a piece of one", changelog.Item{Partition: 3, Seq: 21, Piece: true}, true},
		{"a message skipped as held, not reflected yet", changelog.Item{Partition: 1, Seq: 11}, true},
		{"a message skipped as held, reflected", changelog.Item{Partition: 1, Seq: 10}, false},
		{"an unreadable message, reflected", changelog.Item{Partition: 3, Seq: 19, Err: errors.New("bad")}, false},
	}
	for _, tt := range tests {
		if got := waits(next, tt.it, applied); got != tt.want {
			t.Errorf("%s: waits = %v, want %v", tt.name, got, tt.want)
		}
	}
	for p, want := range []bool{false, true, false, true} {
		if got := next.touches(p); got != want {
			t.Errorf("touches(%d) = %v, want %v", p, got, want)
		}
	}
}

func commitReqOf(p int, sizes ...int) *commitReq {
	q := &commitReq{partition: p, done: make(chan error, 1)}
	for _, n := range sizes {
		q.entries = append(q.entries, store.Entry{Input: store.InputRecord{Payload: make([]byte, n)}})
	}
	return q
}

// A request's size is its payloads' whole size: a rejected input keeps
// only a prefix of its payload, but its record counts what it was.
func TestCommitReqSize(t *testing.T) {
	q := commitReqOf(0, 10, 20)
	q.entries = append(q.entries, store.Entry{Input: store.InputRecord{Payload: make([]byte, 4), Stored: &store.StoredPayload{Size: 1000}}})
	if got := q.size(); got != 1030 {
		t.Errorf("size = %d, want 1030", got)
	}
}

// A round gathers the requests waiting, without waiting for more, up to
// its bounds in inputs and in bytes (counting the first request, taken
// already); what is left waits for the next round.
func TestCommitRoundGather(t *testing.T) {
	tests := []struct {
		name               string
		first              *commitReq
		waiting            []*commitReq
		maxBatch, maxBytes int
		want               int // requests taken
	}{
		{"all that wait", nil, []*commitReq{commitReqOf(0, 1), commitReqOf(1, 1, 1)}, 100, 1 << 20, 2},
		{"nothing waits", commitReqOf(0, 1), nil, 100, 1 << 20, 0},
		{"up to the inputs' bound", nil, []*commitReq{commitReqOf(0, 1, 1), commitReqOf(1, 1, 1), commitReqOf(2, 1)}, 4, 1 << 20, 2},
		{"the first counts", commitReqOf(0, 1, 1, 1), []*commitReq{commitReqOf(1, 1), commitReqOf(2, 1)}, 4, 1 << 20, 1},
		{"up to the bytes' bound", nil, []*commitReq{commitReqOf(0, 600), commitReqOf(1, 600), commitReqOf(2, 1)}, 100, 1000, 2},
		{"a first over the bytes' bound goes alone", commitReqOf(0, 2000), []*commitReq{commitReqOf(1, 1)}, 100, 1000, 0},
	}
	for _, tt := range tests {
		c := &committer{maxBatch: tt.maxBatch, maxBytes: tt.maxBytes}
		ch := make(chan *commitReq, len(tt.waiting))
		for _, q := range tt.waiting {
			ch <- q
		}
		got := c.gather(&ch, tt.first)
		if !slices.Equal(got, tt.waiting[:tt.want]) {
			t.Errorf("%s: took %d requests, want %d", tt.name, len(got), tt.want)
		}
		if ch == nil || len(ch) != len(tt.waiting)-tt.want {
			t.Errorf("%s: %d left waiting, want %d", tt.name, len(ch), len(tt.waiting)-tt.want)
		}
	}
	// A closed channel is set to nil: nothing more comes.
	ch := make(chan *commitReq, 1)
	ch <- commitReqOf(0, 1)
	close(ch)
	c := &committer{maxBatch: 100, maxBytes: 1 << 20}
	if got := c.gather(&ch, nil); len(got) != 1 || ch != nil {
		t.Errorf("closed: took %d, channel nil %v", len(got), ch == nil)
	}
}

// fakeLog is a changelog that takes an append when its fence is the
// partition's last sequence, as changelog.Log does.
type fakeLog struct {
	mu   sync.Mutex
	last map[int]uint64
	seq  uint64
	got  []int // partitions appended to, in order
}

func (l *fakeLog) Append(_ context.Context, p int, after uint64, _ []byte) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last[p] != after {
		return 0, changelog.ErrFenced
	}
	l.seq++
	l.last[p] = l.seq
	l.got = append(l.got, p)
	return l.seq, nil
}

// Launching a round: a request prepared before its partition's foreign
// mark moved is sent back to be prepared again (errBehind) and appends
// nothing; the others are grouped into one record per partition, appended
// with the partition's fence; an append whose fence is stale is refused.
func TestCommitRoundLaunch(t *testing.T) {
	ls := newLogState(3, map[int]uint64{0: 5, 2: 7}, 0)
	ls.setForeign(1, 4)
	fl := &fakeLog{last: map[int]uint64{0: 5, 2: 9}, seq: 100}
	c := &committer{log: ls, clog: fl, metrics: NewMetrics(), logger: slog.New(slog.DiscardHandler)}
	stale := commitReqOf(1, 1)
	stale.seen = 3
	a, b, other := commitReqOf(0, 1), commitReqOf(0, 1, 1), commitReqOf(2, 1)
	rd := c.launch([]*commitReq{a, stale, b, other})
	if rd == nil {
		t.Fatal("nothing launched")
	}
	defer rd.cancel()
	rd.appends.Wait()
	if err := <-stale.done; !errors.Is(err, errBehind) {
		t.Errorf("stale request: %v, want errBehind", err)
	}
	if len(rd.batches) != 2 || rd.batches[0].partition != 0 || rd.batches[1].partition != 2 {
		t.Fatalf("batches %+v, want partitions 0 and 2", rd.batches)
	}
	if b0 := rd.batches[0]; len(b0.reqs) != 2 || len(b0.entries) != 3 {
		t.Errorf("partition 0: %d requests, %d entries; want 2 and 3", len(b0.reqs), len(b0.entries))
	}
	if rd.errs[0] != nil || rd.seqs[0] != 101 {
		t.Errorf("partition 0 appended at %d (%v), want 101", rd.seqs[0], rd.errs[0])
	}
	// The store reflects 7 of partition 2, the log holds 9: fenced.
	if !errors.Is(rd.errs[1], changelog.ErrFenced) || rd.seqs[1] != 0 {
		t.Errorf("partition 2: %d, %v; want fenced", rd.seqs[1], rd.errs[1])
	}
	if !slices.Equal(fl.got, []int{0}) {
		t.Errorf("appended to %v, want [0]", fl.got)
	}
	// Until the round is finished its own record is the fence of the
	// next, and the follower skips it.
	if ls.fence(0) != 101 || !ls.has(0, 101) {
		t.Errorf("fence %d, has %v after the append", ls.fence(0), ls.has(0, 101))
	}
}
