package o200k

import (
	"math"
	"sync"
)

// noRank marks an adjacent pair whose concatenation is not a token.
const noRank = math.MaxUint32

// smallPiece is the size of the callers' stack buffers for ids; longer
// pieces allocate their id slice.
const smallPiece = 128

// linearMax is the longest piece merged by the linear scan, which is
// quadratic but has the least overhead: it is the faster on English words
// (6-16 bytes), the heap version on longer runs such as CJK text
// (operations.md, section 7, has the figures).
const linearMax = 16

// pairRank returns the rank of bytes a..b of the piece text[lo:], or noRank.
// Looking up through the whole text rather than the piece lets rankOf use
// one 8-byte load even for strings at the end of the piece.
func (v *vocab) pairRank(text string, lo, a, b int) uint32 {
	return v.rankOf(text, lo+a, lo+b)
}

// merge byte-pair-encodes the piece text[lo:hi] (which is not itself a
// token) into ids and returns the number of tokens. ids must have room for
// hi-lo entries.
//
// The rule is tiktoken's: while some adjacent pair of parts concatenates to a
// token, merge the pair with the lowest rank, the leftmost one on ties.
func (v *vocab) merge(text string, lo, hi int, ids []uint32) int {
	if hi-lo > linearMax {
		return v.mergeLarge(text, lo, hi, ids)
	}
	return v.mergeLinear(text, lo, hi, ids)
}

// mergeLinear is merge for short pieces (at most linearMax bytes): a linear
// scan for the best pair over small arrays on the stack.
func (v *vocab) mergeLinear(text string, lo, hi int, ids []uint32) int {
	piece := text[lo:hi]
	// Parts are kept as parallel arrays compacted after every merge:
	// start[i] is where part i begins (start[m] == len(piece)), id[i] its
	// token id, and rank[i] the rank of part i joined with part i+1.
	var start [linearMax + 1]uint8
	var rank [linearMax]uint32
	n := len(piece)
	for i := 0; i < n; i++ {
		start[i] = uint8(i)
		ids[i] = v.byteRank[piece[i]]
	}
	start[n] = uint8(n)
	for i := 0; i+1 < n; i++ {
		rank[i] = v.pairRank(text, lo, i, i+2)
	}
	m := n // number of parts
	for m > 1 {
		best, at := uint32(noRank), -1
		for i := 0; i+1 < m; i++ {
			if rank[i] < best {
				best, at = rank[i], i
			}
		}
		if at < 0 {
			break
		}
		// Part at absorbs part at+1.
		ids[at] = best
		copy(start[at+1:m], start[at+2:m+1])
		copy(ids[at+1:m-1], ids[at+2:m])
		copy(rank[at+1:m-1], rank[at+2:m])
		m--
		if at+1 < m {
			rank[at] = v.pairRank(text, lo, int(start[at]), int(start[at+2]))
		} else {
			rank[at] = noRank
		}
		if at > 0 {
			rank[at-1] = v.pairRank(text, lo, int(start[at-1]), int(start[at+1]))
		}
	}
	return m
}

// mergeLarge is merge for long pieces: parts form a doubly linked list over
// byte offsets and candidate pairs sit in a min-heap ordered by (rank,
// offset), which is the same "lowest rank, leftmost" choice as the linear
// scan, in O(n log n). Heap entries are invalidated lazily: an entry is live
// only while its left part still exists and its recorded pair rank is still
// the current one. A part's pair only ever grows, and distinct byte strings
// have distinct ranks, so a stale entry can never look current.
func (v *vocab) mergeLarge(text string, lo, hi int, ids []uint32) int {
	piece := text[lo:hi]
	n := len(piece)
	sc := scratchPool.Get().(*mergeScratch)
	defer func() {
		if n <= maxPooledPiece {
			scratchPool.Put(sc)
		}
	}()
	sc.grow(n)
	next := sc.next[:n]   // offset of the following part, n at the end
	prev := sc.prev[:n]   // offset of the preceding part, -1 at the start
	cur := sc.cur[:n]     // current pair rank of the part starting here
	id := sc.id[:n]       // token id of the part starting here
	alive := sc.alive[:n] // whether a part starts here
	h := sc.heap[:0]
	for i := 0; i < n; i++ {
		next[i], prev[i], alive[i] = int32(i+1), int32(i-1), true
		id[i] = v.byteRank[piece[i]]
		cur[i] = noRank
		if i+2 <= n {
			if r := v.pairRank(text, lo, i, i+2); r != noRank {
				cur[i] = r
				h = append(h, pairEntry{r, int32(i)})
			}
		}
	}
	h.init()
	end := func(p int32) int {
		if p >= int32(n) {
			return n
		}
		return int(next[p])
	}
	for len(h) > 0 {
		var e pairEntry
		e, h = h.pop()
		p := e.pos
		if !alive[p] || cur[p] != e.rank {
			continue
		}
		q := next[p] // the right part, absorbed into p
		id[p] = e.rank
		alive[q] = false
		next[p] = next[q]
		if next[q] < int32(n) {
			prev[next[q]] = p
		}
		// p's pair now reaches one part further; so does its left neighbour's.
		cur[p] = noRank
		if next[p] < int32(n) {
			if r := v.pairRank(text, lo, int(p), end(next[p])); r != noRank {
				cur[p] = r
				h = h.push(pairEntry{r, p})
			}
		}
		if l := prev[p]; l >= 0 {
			cur[l] = noRank
			if r := v.pairRank(text, lo, int(l), int(next[p])); r != noRank {
				cur[l] = r
				h = h.push(pairEntry{r, l})
			}
		}
	}
	sc.heap = h[:0] // keep a grown heap for the next piece
	m := 0
	for p := int32(0); p < int32(n); p = next[p] {
		ids[m] = id[p]
		m++
	}
	return m
}

// mergeScratch is mergeLarge's working memory. It is pooled rather than put
// on the stack because zeroing a stack frame big enough for long pieces
// would cost more than the merge of a typical 20-byte piece; every slot used
// is initialized before it is read.
type mergeScratch struct {
	next, prev []int32
	cur, id    []uint32
	alive      []bool
	heap       pairHeap
}

// maxPooledPiece keeps huge pieces' buffers out of the pool.
const maxPooledPiece = 4096

var scratchPool = sync.Pool{New: func() any { return new(mergeScratch) }}

func (s *mergeScratch) grow(n int) {
	if cap(s.next) >= n {
		return
	}
	n = max(n, smallPiece)
	s.next, s.prev = make([]int32, n), make([]int32, n)
	s.cur, s.id = make([]uint32, n), make([]uint32, n)
	s.alive = make([]bool, n)
	// n-1 initial pairs plus at most two pushes per merge, less one pop
	// per merge, stay under 2n; append grows it if ever needed.
	s.heap = make(pairHeap, 0, 2*n)
}

type pairEntry struct {
	rank uint32
	pos  int32
}

func (a pairEntry) less(b pairEntry) bool {
	return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos)
}

// pairHeap is a binary min-heap, written out rather than via container/heap
// to avoid interface calls in the loop.
type pairHeap []pairEntry

func (h pairHeap) init() {
	for i := len(h)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

// push and pop return the updated heap rather than working through a
// pointer, which keeps the slice header in registers.
func (h pairHeap) push(e pairEntry) pairHeap {
	s := append(h, e)
	i := len(s) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !s[i].less(s[p]) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
	return s
}

func (h pairHeap) pop() (pairEntry, pairHeap) {
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	h.down(0)
	return top, h
}

func (h pairHeap) down(i int) {
	n := len(h)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		c := l
		if r := l + 1; r < n && h[r].less(h[l]) {
			c = r
		}
		if !h[c].less(h[i]) {
			return
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
}
