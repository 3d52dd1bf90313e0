package pipeline

import (
	"testing"
)

// Rendezvous hashing spreads partitions evenly, and an instance leaving
// moves only its own partitions.
func TestPreferredSpreadsAndMovesLittle(t *testing.T) {
	for _, members := range [][]string{
		{"vm-a9692f1b", "vm-ccc8698a", "vm-2e7fa7ab"}, // names that differ only in a suffix
		{"inst-1", "inst-2", "inst-3", "inst-4"},
	} {
		const n = 65
		count := map[string]int{}
		for p := range n {
			count[Preferred(p, members)]++
		}
		for _, m := range members {
			share := float64(n) / float64(len(members))
			if c := float64(count[m]); c < share/2 || c > share*1.6 {
				t.Errorf("%v: %s preferred for %d of %d partitions", members, m, count[m], n)
			}
		}
		gone := members[0]
		for p := range n {
			before, after := Preferred(p, members), Preferred(p, members[1:])
			if before != gone && before != after {
				t.Errorf("partition %d moved from %s to %s when %s left", p, before, after, gone)
			}
		}
	}
	if got := Preferred(3, nil); got != "" {
		t.Errorf("no members: %q", got)
	}
}
