package pipeline

import (
	"context"
	"slices"
	"testing"
	"time"
)

// The fence an append to a partition must find last: the store's last
// record of it, the last piece of an unfinished record after that, or this
// instance's own record still committing, whichever is latest.
func TestLogStateFence(t *testing.T) {
	tests := []struct {
		name          string
		applied, tail uint64
		own           uint64 // appended by the round still committing (0: none)
		want          uint64
	}{
		{"nothing yet", 0, 0, 0, 0},
		{"the store's last record", 7, 0, 0, 7},
		{"an unfinished record's last piece after it", 7, 9, 0, 9},
		{"a piece before the store's record counts not", 7, 5, 0, 7},
		{"the own record still committing", 7, 0, 12, 12},
		{"the latest of the three", 7, 9, 8, 9},
	}
	for _, tt := range tests {
		ls := newLogState(3, map[int]uint64{1: tt.applied}, 0)
		ls.pieceTail[1] = tt.tail
		if tt.own > 0 {
			ls.appending(1)
			ls.appended(1, tt.own)
		}
		if got := ls.fence(1); got != tt.want {
			t.Errorf("%s: fence = %d, want %d", tt.name, got, tt.want)
		}
		if got := ls.fence(2); got != 0 {
			t.Errorf("%s: another partition's fence = %d, want 0", tt.name, got)
		}
	}
}

// The cursor a follower restarts from never passes the first piece of a
// record still incomplete in a partition this instance follows, and never
// goes back.
func TestLogStateSafeCursor(t *testing.T) {
	tests := []struct {
		name  string
		start uint64
		heads map[int]uint64 // first piece of an incomplete record, per partition
		held  []bool         // per partition 0..2
		to    uint64
		want  uint64
	}{
		{"moves on", 3, nil, []bool{true, true, true}, 10, 10},
		{"never back", 10, nil, []bool{true, true, true}, 4, 10},
		{"held back before a piece", 3, map[int]uint64{1: 6}, []bool{true, true, true}, 10, 5},
		{"the earliest piece holds it", 3, map[int]uint64{1: 8, 2: 6}, []bool{true, true, true}, 10, 5},
		{"a partition not followed holds nothing", 3, map[int]uint64{1: 6}, []bool{true, false, true}, 10, 10},
		{"held back, but not behind where it is", 7, map[int]uint64{1: 6}, []bool{true, true, true}, 10, 7},
	}
	for _, tt := range tests {
		ls := newLogState(2, nil, tt.start)
		ls.held = func(p int) bool { return tt.held[p] }
		for p, head := range tt.heads {
			ls.pieceHead[p] = head
		}
		ls.setCursor(tt.to)
		if got := ls.safeCursor(); got != tt.want {
			t.Errorf("%s: safeCursor = %d, want %d", tt.name, got, tt.want)
		}
	}
}

// What the follower skips as held already: what the store reflects, this
// instance's own record committing, and anything of a partition while an
// append to it is in flight (its sequence is not known yet).
func TestLogStateHas(t *testing.T) {
	ls := newLogState(2, map[int]uint64{0: 5}, 0)
	ls.appending(1)
	ls.appended(1, 9)
	ls.appending(2)
	tests := []struct {
		p    int
		seq  uint64
		want bool
	}{
		{0, 5, true},
		{0, 6, false},
		{1, 9, true},
		{1, 10, false},
		{2, 100, true}, // in flight
		{-1, 1, false}, // no such partition
		{3, 1, false},  // past the last
	}
	for _, tt := range tests {
		if got := ls.has(tt.p, tt.seq); got != tt.want {
			t.Errorf("has(%d, %d) = %v, want %v", tt.p, tt.seq, got, tt.want)
		}
	}
	// The commit of the round that appended 9 ends: the own mark goes, so
	// the follower reads it should the commit have failed.
	ls.appendDone(map[int]uint64{1: 9})
	if ls.has(1, 9) || ls.fence(1) != 0 {
		t.Errorf("after appendDone: has = %v, fence = %d", ls.has(1, 9), ls.fence(1))
	}
	// A later round's record, appended meanwhile, stays its own.
	ls.appending(0)
	ls.appended(0, 12)
	ls.appendDone(map[int]uint64{0: 11})
	if !ls.has(0, 12) || ls.fence(0) != 12 {
		t.Errorf("a later round's record: has = %v, fence = %d", ls.has(0, 12), ls.fence(0))
	}
}

// A message read again (applyFollowed found it skipped as this instance's
// own while the store lacks it) is not skipped for an append in flight, or
// an own mark, again: appends fenced and retried one after the other must
// not keep the follower from the record that fences them.
func TestLogStateHasAfterReread(t *testing.T) {
	ls := newLogState(1, map[int]uint64{0: 5}, 0)
	ls.appending(0) // fenced after 5; another writer's 6 is in the log
	if !ls.has(0, 6) {
		t.Fatal("an append in flight: 6 could be this instance's own")
	}
	ls.rereading(0, 6)
	for _, tt := range []struct {
		seq  uint64
		want bool
	}{
		{5, true},  // applied
		{6, false}, // read again, with its data, whatever is in flight
		{7, true},  // past the mark: could be the append in flight
	} {
		if got := ls.has(0, tt.seq); got != tt.want {
			t.Errorf("in flight, read again up to 6: has(0, %d) = %v, want %v", tt.seq, got, tt.want)
		}
	}
	// An own record below the mark (a commit that failed, read again) is
	// read with its data too; one past it is skipped as before.
	ls.appended(0, 6)
	if ls.has(0, 6) {
		t.Error("an own record read again is skipped")
	}
	ls.appending(0)
	ls.appended(0, 8)
	if !ls.has(0, 8) {
		t.Error("a later own record, past the mark, is not skipped")
	}
	// The mark only moves forward.
	ls.rereading(0, 3)
	if ls.has(0, 6) {
		t.Error("the mark went back")
	}
	ls.rereading(-1, 9) // no such partition: nothing happens
	ls.rereading(2, 9)
}

// The foreign mark only moves forward, and the applied position likewise.
func TestLogStateMarks(t *testing.T) {
	ls := newLogState(1, nil, 0)
	ls.setForeign(0, 8)
	ls.setForeign(0, 3)
	if got := ls.foreignMark(0); got != 8 {
		t.Errorf("foreign mark %d, want 8", got)
	}
	ls.setApplied(0, 10)
	ls.setApplied(0, 4)
	if got := ls.appliedOf(0); got != 10 {
		t.Errorf("applied %d, want 10", got)
	}
}

// waitSeen returns once the partition's messages are handled (or its own
// record committed) up to the sequence, and not before.
func TestLogStateWaitSeen(t *testing.T) {
	ls := newLogState(1, map[int]uint64{0: 3}, 0)
	done := func() context.Context {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		return ctx
	}()
	if err := ls.waitSeen(done, 0, 3); err != nil {
		t.Errorf("applied up to 3: %v", err)
	}
	if err := ls.waitSeen(done, 0, 4); err == nil {
		t.Error("waitSeen(4) returned before 4 was handled")
	}
	errs := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		errs <- ls.waitSeen(ctx, 0, 6)
	}()
	ls.setSeen(0, 5)
	ls.setSeen(0, 6)
	if err := <-errs; err != nil {
		t.Errorf("waitSeen(6) after 6 was handled: %v", err)
	}
}

// The instance's cursor is the least of its files' cursors, leaving out the
// files that hold no partition now: theirs stands still.
func TestLeastCursorLeavesOutFilesHoldingNothing(t *testing.T) {
	file := func(cursor uint64, held ...int) *logState {
		ls := newLogState(4, nil, cursor)
		ls.held = func(p int) bool { return slices.Contains(held, p) }
		return ls
	}
	for _, tt := range []struct {
		name string
		logs []*logState
		want uint64
	}{
		{"one file", []*logState{file(7, 0, 1)}, 7},
		{"the least of the holding files", []*logState{file(90, 0), file(40, 2)}, 40},
		{"a file holding nothing is left out", []*logState{file(5), file(120, 3)}, 120},
		{"no file holds anything", []*logState{file(5), file(9)}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := leastCursor(tt.logs); got != tt.want {
				t.Fatalf("leastCursor = %d, want %d", got, tt.want)
			}
		})
	}
}
