package o200k

import "math/bits"

// Rank lookup is the inner loop of both the piece lookup and the merge, and
// a general map[string]int over 200 000 tokens costs two cache misses per
// probe (the map group, then the separately allocated key). Most lookups are
// for short strings, so they get flatter structures:
//
//   - two-byte strings index a 64 Ki array directly;
//   - strings of up to eight bytes are packed into a uint64 and looked up in
//     an open-addressing table whose slots hold the packed key and the id
//     together, so a probe touches one cache line and compares no memory.
//     The table (4 MiB) is larger than a core's L2 cache, and most merge
//     lookups miss (70% on CJK text), so a 256 KiB Bloom filter in front of
//     it answers most misses without touching the table;
//   - only longer strings fall back to a map.

// shortMax is the longest token the packed table holds.
const shortMax = 8

// shortSlot holds one packed token; val is id | len<<24, so a token slot is
// never zero and zero marks an empty slot.
type shortSlot struct {
	key uint64
	val uint32
}

type shortTable struct {
	slots []shortSlot
	shift uint // 64 - log2(len(slots))
	// bloom is a blocked Bloom filter: each key sets two bits in one word,
	// so a query reads a single word. With 148k keys in 2^21 bits it
	// passes about 3% of the strings that are not tokens.
	bloom []uint64
}

// bloomWordBits is log2 of the filter's word count (2^15 words = 256 KiB).
const bloomWordBits = 15

func newShortTable(n int) *shortTable {
	// Keep the load factor at or below one half so linear probing stays
	// short, in particular for the many lookups that miss.
	b := bits.Len(uint(2*n - 1))
	return &shortTable{
		slots: make([]shortSlot, 1<<b),
		shift: uint(64 - b),
		bloom: make([]uint64, 1<<bloomWordBits),
	}
}

// hash mixes the packed key and its length (which tells "ab" from "ab\x00").
func hash(key uint64, n int) uint64 {
	return (key ^ uint64(n)<<61) * 0x9E3779B97F4A7C15
}

// bloomProbe derives the filter word and its two-bit mask from the upper
// bits of a second multiplication, which do not overlap with home's bits.
func bloomProbe(h uint64) (word uint64, mask uint64) {
	f := (h ^ h>>29) * 0xBF58476D1CE4E5B9
	return f >> (64 - bloomWordBits), 1<<(f>>40&63) | 1<<(f>>34&63)
}

func (t *shortTable) put(key uint64, n int, id uint32) {
	h := hash(key, n)
	w, m := bloomProbe(h)
	t.bloom[w] |= m
	mask := uint64(len(t.slots) - 1)
	for i := h >> t.shift; ; i = (i + 1) & mask {
		if t.slots[i].val == 0 {
			t.slots[i] = shortSlot{key: key, val: id | uint32(n)<<24}
			return
		}
	}
}

func (t *shortTable) get(key uint64, n int) uint32 {
	h := hash(key, n)
	if w, m := bloomProbe(h); t.bloom[w]&m != m {
		return noRank
	}
	mask := uint64(len(t.slots) - 1)
	want := uint32(n) << 24
	for i := h >> t.shift; ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.val == 0 {
			return noRank
		}
		if s.key == key && s.val&0xFF000000 == want {
			return s.val & 0xFFFFFF
		}
	}
}

// pack returns s[a:a+n] (n <= 8) as a little-endian uint64, zero-padded.
// When eight bytes are available it uses one combined load, which the
// compiler emits for this byte-by-byte pattern.
func pack(s string, a, n int) uint64 {
	if a+8 <= len(s) {
		w := s[a : a+8]
		k := uint64(w[0]) | uint64(w[1])<<8 | uint64(w[2])<<16 | uint64(w[3])<<24 |
			uint64(w[4])<<32 | uint64(w[5])<<40 | uint64(w[6])<<48 | uint64(w[7])<<56
		if n < 8 {
			k &= 1<<(8*uint(n)) - 1
		}
		return k
	}
	var k uint64
	for i := 0; i < n; i++ {
		k |= uint64(s[a+i]) << (8 * uint(i))
	}
	return k
}

// rankOf returns the id of the token s[a:b], or noRank if it is not a token.
func (v *vocab) rankOf(s string, a, b int) uint32 {
	switch n := b - a; {
	case n == 1:
		return v.byteRank[s[a]]
	case n == 2:
		return v.pair2[uint16(s[a])|uint16(s[a+1])<<8]
	case n <= shortMax:
		return v.short.get(pack(s, a, n), n)
	case n > v.maxLen:
		return noRank
	default:
		if id, ok := v.long[s[a:b]]; ok {
			return id
		}
		return noRank
	}
}
