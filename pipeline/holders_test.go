package pipeline

import (
	"fmt"
	"slices"
	"testing"
)

// Rank puts the preferred instance first, and Holders are a prefix of it.
func TestRankAgreesWithPreferred(t *testing.T) {
	members := []string{"inst-1", "inst-2", "inst-3", "inst-4"}
	for p := range 200 {
		r := Rank(p, members)
		if r[0] != Preferred(p, members) || len(r) != len(members) {
			t.Fatalf("partition %d: rank %v, preferred %s", p, r, Preferred(p, members))
		}
		for n := range 5 {
			h := Holders(p, members, n)
			if want := r[:min(len(r), n+1)]; !slices.Equal(h, want) {
				t.Fatalf("partition %d standby %d: holders %v, want %v", p, n, h, want)
			}
		}
	}
	if got := Rank(1, []string{"a", "a", "b"}); len(got) != 2 {
		t.Fatalf("duplicates count once: %v", got)
	}
}

// Who holds and who pulls what, given the live instances, the standby count
// and whether this instance caught up.
func TestAssign(t *testing.T) {
	three := []string{"inst-1", "inst-2", "inst-3"}
	const n = 49
	for _, tc := range []struct {
		name     string
		live     []string
		me       string
		caughtUp bool
		standby  int
		// held and pulled: how many partitions me holds and pulls.
		held, pulled func([]bool) bool
	}{
		{"alone and catching up: holds and pulls everything", nil, "inst-1", false, 1,
			all(true), all(true)},
		{"alone, no name (no members)", nil, "", false, 0, all(true), all(true)},
		{"catching up among others: holds its share, pulls nothing", three[1:], "inst-1", false, 1,
			holdsShare(three, "inst-1", 1), all(false)},
		{"caught up: pulls what it is preferred for", three, "inst-1", true, 1,
			holdsShare(three, "inst-1", 1), pullsShare(three, "inst-1")},
		{"standby 0: holds only what it owns", three, "inst-2", true, 0,
			holdsShare(three, "inst-2", 0), pullsShare(three, "inst-2")},
		{"standby 2 of 3: holds everything", three, "inst-3", true, 2,
			all(true), pullsShare(three, "inst-3")},
		{"standby beyond the instances: holds everything", three, "inst-3", true, 9,
			all(true), pullsShare(three, "inst-3")},
		{"not yet listed but caught up: counts itself", three[:2], "inst-3", true, 1,
			holdsShare(three, "inst-3", 1), pullsShare(three, "inst-3")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := Assign(n, tc.live, tc.me, tc.caughtUp, tc.standby)
			if !tc.held(a.Held) {
				t.Errorf("held %v", a.Held)
			}
			if !tc.pulled(a.Pull) {
				t.Errorf("pulled %v", a.Pull)
			}
			for p := range n {
				if a.Pull[p] && !a.Held[p] {
					t.Errorf("partition %d pulled but not held", p)
				}
			}
		})
	}
}

func all(v bool) func([]bool) bool {
	return func(got []bool) bool { return !slices.Contains(got, !v) }
}

func holdsShare(members []string, me string, standby int) func([]bool) bool {
	return func(held []bool) bool {
		for p := range held {
			if held[p] != slices.Contains(Holders(p, members, standby), me) {
				return false
			}
		}
		return true
	}
}

func pullsShare(members []string, me string) func([]bool) bool {
	return func(pull []bool) bool {
		for p := range pull {
			if pull[p] != (Preferred(p, members) == me) {
				return false
			}
		}
		return true
	}
}

// Over three instances every partition has exactly 1+standby holders and
// one owner (how evenly rendezvous hashing spreads them is
// TestPreferredSpreadsAndMovesLittle's).
func TestHoldersSpread(t *testing.T) {
	names := []string{"inst-1", "inst-2", "inst-3"}
	const n = 48
	for _, standby := range []int{0, 1} {
		held := map[string]int{}
		for p := range n {
			k, owners := 0, 0
			for _, me := range names {
				switch RoleOf(p, names, me, standby) {
				case RoleOwner:
					owners++
					k++
					held[me]++
				case RoleStandby:
					k++
					held[me]++
				}
			}
			if owners != 1 || k != 1+standby {
				t.Fatalf("standby %d, partition %d: %d owners, %d holders", standby, p, owners, k)
			}
		}
		total := 0
		for _, me := range names {
			if held[me] == 0 {
				t.Errorf("standby %d: %s holds nothing", standby, me)
			}
			total += held[me]
		}
		if total != n*(1+standby) {
			t.Errorf("standby %d: %d partitions held in all, want %d", standby, total, n*(1+standby))
		}
		t.Logf("standby %d: %v", standby, fmt.Sprint(held))
	}
}
