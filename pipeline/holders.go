package pipeline

import (
	"hash/fnv"
	"slices"
	"strconv"
)

// Who holds a partition's state, and who pulls its inputs, is decided from
// the list of live instances alone, so that every instance computes the
// same answer and the partitions spread over the instances as soon as they
// are up, before any input arrives (the server's pin moves only with a
// delivery; the assignment does not wait for one).
//
// The instances are ranked per partition by rendezvous hashing (rank): the
// first is the owner, which pulls the partition's inputs; the next standby
// ones follow its changelog too, so that one of them can take over within
// seconds. The others keep no state of it.

// score is instance m's rendezvous score for partition p.
func score(p int, m string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(m))
	h.Write([]byte{0})
	h.Write([]byte(strconv.Itoa(p)))
	// FNV's last bytes reach only the low half of the sum: without a
	// finalizer the name alone would decide the top bits, and one instance
	// would be preferred for nearly every partition.
	return mix64(h.Sum64())
}

// mix64 is SplitMix64's finalizer: every input bit flips about half of
// the output bits.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Rank orders members for partition p, the owner first: highest score
// first, ties by name. Duplicate names count once.
func Rank(p int, members []string) []string {
	type scored struct {
		m string
		v uint64
	}
	out := make([]scored, 0, len(members))
	for _, m := range members {
		if !slices.ContainsFunc(out, func(s scored) bool { return s.m == m }) {
			out = append(out, scored{m, score(p, m)})
		}
	}
	slices.SortFunc(out, func(a, b scored) int {
		switch {
		case a.v > b.v:
			return -1
		case a.v < b.v:
			return 1
		case a.m < b.m:
			return -1
		case a.m > b.m:
			return 1
		}
		return 0
	})
	names := make([]string, len(out))
	for i, s := range out {
		names[i] = s.m
	}
	return names
}

// Preferred is the instance that should own partition p among members:
// rendezvous hashing, so every instance computes the same answer from the
// same list, the partitions spread evenly, and an instance joining or
// leaving moves only its own share.
func Preferred(p int, members []string) string {
	var best string
	var top uint64
	for _, m := range members {
		if v := score(p, m); best == "" || v > top || (v == top && m < best) {
			best, top = m, v
		}
	}
	return best
}

// Holders are the instances that keep partition p's state: its owner and
// the next standby instances of its ranking (fewer when fewer run).
func Holders(p int, members []string, standby int) []string {
	r := Rank(p, members)
	return r[:min(len(r), 1+max(standby, 0))]
}

// Role is what an instance is to a partition.
type Role uint8

const (
	// RoleNone keeps no state of the partition.
	RoleNone Role = iota
	// RoleOwner keeps its state and pulls its inputs.
	RoleOwner
	// RoleStandby keeps its state (follows its changelog) to take over.
	RoleStandby
)

func (r Role) String() string {
	switch r {
	case RoleOwner:
		return "owner"
	case RoleStandby:
		return "standby"
	}
	return "none"
}

// Assignment is what one instance does with each partition.
type Assignment struct {
	// Held says, per partition, whether the instance keeps its state
	// (follows its changelog): owner or standby among the live instances
	// and itself.
	Held []bool
	// Pull says, per partition, whether it pulls the partition's inputs:
	// it is the owner among the instances that may own partitions now.
	Pull []bool
}

// Assign decides, for n partitions, what instance name holds and pulls,
// given the live instances (those that may own partitions: InstanceLock.Live
// leaves out the ones still catching up) and standby. An instance holds its
// share counting itself in any case (it restores that share while it
// catches up); it pulls only once it may own partitions (caughtUp), or
// when nobody else may (live is empty): somebody must pull.
func Assign(n int, live []string, name string, caughtUp bool, standby int) Assignment {
	all := live
	if !slices.Contains(all, name) {
		all = append(slices.Clone(live), name)
	}
	owners := live
	if caughtUp || len(live) == 0 {
		owners = all
	}
	a := Assignment{Held: make([]bool, n), Pull: make([]bool, n)}
	for p := range n {
		a.Held[p] = slices.Contains(Holders(p, all, standby), name)
		a.Pull[p] = Preferred(p, owners) == name
	}
	return a
}

// RoleOf is name's role for partition p among members.
func RoleOf(p int, members []string, name string, standby int) Role {
	switch i := slices.Index(Holders(p, members, standby), name); {
	case i == 0:
		return RoleOwner
	case i > 0:
		return RoleStandby
	}
	return RoleNone
}
