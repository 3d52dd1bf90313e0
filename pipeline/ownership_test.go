package pipeline

import (
	"log/slog"
	"slices"
	"testing"
)

// What ownership does with an assignment: it holds its share at once (the
// followers are told), pulls a partition only once it is restored, and
// when another instance becomes preferred for a partition it pulls, it
// stops pulling it, marking it handed over if it held the pin.
func TestOwnershipAssign(t *testing.T) {
	const n = 7 // partitions 0..7
	heldChanges, pullChanges := 0, 0
	o := &ownership{name: "a", standby: 0, logger: slog.New(slog.DiscardHandler), metrics: NewMetrics(),
		heldChanged: func() { heldChanges++ }, pullChanged: func() { pullChanges++ }}
	o.init(n)
	o.caughtUp.Store(true)
	wanted := func() []int {
		var out []int
		for p := range o.parts {
			if o.parts[p].want.Load() {
				out = append(out, p)
			}
		}
		return out
	}

	// Alone: holds everything, pulls nothing before it is restored.
	o.assign([]string{"a"})
	if held, _ := o.holds.counts(); held != n+1 || heldChanges != 1 {
		t.Fatalf("alone: holds %d partitions (followers told %d times), want %d and 1", held, heldChanges, n+1)
	}
	if w := wanted(); len(w) != 0 {
		t.Fatalf("pulls %v before any is restored", w)
	}
	for p := 0; p <= n; p++ {
		o.holds.plan(p, 0, true)
	}
	o.assign([]string{"a"})
	if w := wanted(); len(w) != n+1 {
		t.Fatalf("restored: pulls %v, want all", w)
	}
	if heldChanges != 1 || pullChanges != 2 {
		t.Errorf("followers told %d times, query server %d; want 1 and 2", heldChanges, pullChanges)
	}

	// b joins: a keeps pulling only what it is preferred for; a partition
	// it pulled under the pin is handed over, one it pulled without is
	// merely stopped.
	live := []string{"a", "b"}
	var mine, theirs []int
	for p := 0; p <= n; p++ {
		if Preferred(p, live) == "a" {
			mine = append(mine, p)
		} else {
			theirs = append(theirs, p)
		}
	}
	if len(theirs) < 2 {
		t.Fatalf("b is preferred for %v: the test needs two", theirs)
	}
	stopped := map[int]bool{}
	for i, p := range theirs {
		o.parts[p].set(func(s *partState) {
			s.stop = func() { stopped[p] = true }
			s.owning = i == 0
		})
	}
	o.assign(live)
	if w := wanted(); !slices.Equal(w, mine) {
		t.Errorf("with b: pulls %v, want %v", w, mine)
	}
	for i, p := range theirs {
		var yielding bool
		o.parts[p].set(func(s *partState) { yielding = s.yielding })
		if !stopped[p] || yielding != (i == 0) {
			t.Errorf("partition %d: stopped %v, handed over %v; want stopped, handed over %v", p, stopped[p], yielding, i == 0)
		}
	}
	if held, _ := o.holds.counts(); held != len(mine) {
		t.Errorf("with b and no standby: holds %d partitions, want %d", held, len(mine))
	}
	if got := o.answered(); got != nil {
		t.Errorf("answers for %v before the partitions are published", got)
	}
	o.publish(n)
	if got := o.answered(); !slices.Equal(got, mine) {
		t.Errorf("answers for %v, want %v", got, mine)
	}
	for _, p := range theirs {
		if o.answersHere(p) {
			t.Errorf("answers partition %d, which b pulls", p)
		}
	}
}
