package pipeline

import "testing"

// A delivered copy of a replayed, committed input is skipped once: not a
// copy of another partition's input of the same sequence, not twice, and
// nothing once the partition's term starts again.
func TestReplaysSkipTheDeliveredCopyOnce(t *testing.T) {
	r := newReplays()
	r.committed(1, 10)
	r.committed(1, 11)
	steps := []struct {
		p    int
		seq  uint64
		want bool
	}{
		{2, 10, false}, // another partition
		{1, 12, false}, // not replayed
		{1, 10, true},
		{1, 10, false}, // its copy came already
	}
	for _, s := range steps {
		if got := r.take(s.p, s.seq); got != s.want {
			t.Fatalf("take(%d, %d) = %v, want %v", s.p, s.seq, got, s.want)
		}
	}
	r.reset(1)
	if r.take(1, 11) {
		t.Fatal("a new term still skipped an input the last one replayed")
	}
}
