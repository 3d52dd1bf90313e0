package pipeline

import (
	"context"
	"testing"
	"time"
)

// A batch fenced behind a record waits for the follower to apply it: the
// wait ends when the partition's foreign mark moves, not when another
// partition's does, nor when the mark is set to what it was.
func TestWaitForeignEndsWhenThePartitionsMarkMoves(t *testing.T) {
	ls := newLogState(4, nil, 0)
	ls.setForeign(1, 7)
	ended := make(chan error, 1)
	go func() { ended <- ls.waitForeign(context.Background(), 1, 7) }()
	ls.setForeign(2, 9) // another partition
	ls.setForeign(1, 7) // the same mark
	ls.setApplied(1, 8) // applied, but no record of another writer
	select {
	case err := <-ended:
		t.Fatalf("the wait ended (%v) before partition 1's mark moved", err)
	case <-time.After(100 * time.Millisecond):
	}
	ls.setForeign(1, 10)
	select {
	case err := <-ended:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the wait did not end when partition 1's mark moved")
	}
	// A mark that moved already ends the wait at once; a context that ends
	// ends it with its error.
	if err := ls.waitForeign(context.Background(), 1, 7); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := ls.waitForeign(ctx, 1, 10); err == nil {
		t.Fatal("a wait for a mark that never moves ended without the context's error")
	}
}
