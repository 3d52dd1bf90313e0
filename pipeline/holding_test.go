package pipeline

import (
	"slices"
	"testing"
)

// The restore rules: a gained partition is pulled only once the committer
// has handled its last changelog message as of the plan; a partition the
// store holds up to its end is restored at once; dropping and gaining again
// restores again.
func TestHoldingRestoreRules(t *testing.T) {
	h := newHolding(4)
	c := h.update([]bool{true, true, false, false}, nil)
	if !slices.Equal(c.gained, []int{0, 1}) || len(c.dropped) != 0 {
		t.Fatalf("change %+v", c)
	}
	gained, held := h.take(everyPartition)
	if !slices.Equal(gained, []int{0, 1}) || !slices.Equal(held, []int{0, 1}) {
		t.Fatalf("take: gained %v held %v", gained, held)
	}
	if g, _ := h.take(everyPartition); len(g) != 0 {
		t.Fatalf("taken twice: %v", g)
	}
	// Progress before the plan restores nothing.
	if _, done := h.progress(0, 100, 5); done || h.isRestored(0) {
		t.Fatal("restored before its target was read")
	}
	if h.plan(0, 50, false) {
		t.Fatal("behind its target, restored")
	}
	if !h.plan(1, 7, true) || !h.isRestored(1) {
		t.Fatal("current copy not restored at once")
	}
	if rs, done := h.progress(0, 49, 10); done {
		t.Fatalf("restored before the target: %+v", rs)
	}
	rs, done := h.progress(0, 50, 3)
	if !done || rs.partition != 0 || rs.target != 50 || rs.changes != 18 {
		t.Fatalf("restore %+v done %v", rs, done)
	}
	if _, again := h.progress(0, 60, 1); again {
		t.Fatal("restored twice")
	}
	if held, restored := h.counts(); held != 2 || restored != 2 {
		t.Fatalf("counts %d %d", held, restored)
	}
	// Dropped: not held, not restored; gained again: planned anew.
	c = h.update([]bool{false, true, false, false}, nil)
	if !slices.Equal(c.dropped, []int{0}) || h.isHeld(0) || h.isRestored(0) {
		t.Fatalf("drop: %+v", c)
	}
	if _, done := h.progress(0, 70, 1); done {
		t.Fatal("progress on a partition not held")
	}
	h.update([]bool{true, true, false, false}, nil)
	if h.isRestored(0) {
		t.Fatal("regained partition restored without a plan")
	}
	g, _ := h.take(everyPartition)
	h.untake(g)
	if g2, _ := h.take(everyPartition); !slices.Equal(g2, []int{0}) {
		t.Fatalf("untaken partition not planned again: %v", g2)
	}
	// A gained partition dropped before its plan is not planned.
	h.update([]bool{true, true, true, false}, nil)
	h.update([]bool{true, true, false, false}, nil)
	if g3, _ := h.take(everyPartition); len(g3) != 0 {
		t.Fatalf("dropped partition still pending: %v", g3)
	}
}

func everyPartition(int) bool { return true }
