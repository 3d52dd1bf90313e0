package changelog

import (
	"context"
	"testing"

	"github.com/ctxpipe/ctxpipe/bus"
)

// LastOfEach answers for every partition asked, in the order asked: a
// partition with no message is 0, and a failed request fails the whole.
func TestLastOfEach(t *testing.T) {
	js, stream := stateStream(t)
	ctx := context.Background()
	want := map[int]uint64{}
	for _, p := range []int{3, 1, 3, 5, 1} {
		ack, err := js.Publish(ctx, bus.StateSubject(p), []byte("x"))
		if err != nil {
			t.Fatal(err)
		}
		want[p] = ack.Sequence
	}
	parts := []int{5, 2, 1, 3}
	lasts, err := LastOfEach(ctx, stream, parts)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range parts {
		if lasts[i] != want[p] {
			t.Errorf("partition %d: last %d, want %d", p, lasts[i], want[p])
		}
	}
	if lasts, err := LastOfEach(ctx, stream, nil); err != nil || len(lasts) != 0 {
		t.Errorf("no partitions: %v, %v", lasts, err)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := LastOfEach(done, stream, parts); err == nil {
		t.Error("requests under a cancelled context did not fail")
	}
}
