package o200k

import (
	"hash/maphash"
	"strings"
	"sync/atomic"
)

// maxCachedPiece is the longest piece the cache stores. Together with the
// slot count it bounds the cache's memory: an entry holds at most this many
// key bytes and, as every token is at least one byte, at most this many ids.
// Longer pieces are rare enough that caching them buys little.
const maxCachedPiece = 64

// DefaultCacheSize is the number of cache slots an Encoder gets unless
// WithCacheSize says otherwise. At typical piece sizes it costs about 3 MiB;
// the worst case is DefaultCacheSize*CacheEntryMaxBytes.
const DefaultCacheSize = 1 << 15

// CacheEntryMaxBytes bounds the heap memory of one cache slot including its
// entry: the slot pointer (8), entry header (string 16 + slice 24, rounded to
// a 48-byte size class), a key of at most maxCachedPiece bytes and at most
// maxCachedPiece 4-byte ids.
const CacheEntryMaxBytes = 8 + 48 + maxCachedPiece + 4*maxCachedPiece

// cacheEntry is immutable once published, so readers need no lock.
type cacheEntry struct {
	key string
	ids []uint32
}

// pieceCache is a two-way set-associative cache from piece to token ids.
// A piece may live in either slot of its set; a new entry takes an empty slot
// or else evicts one of the two chosen by a hash bit, which is random
// eviction with no bookkeeping and a hard bound of one entry per slot. (Two
// ways instead of one keep pairs of hot pieces that share a set from
// evicting each other on every use.) Slots are atomic pointers to immutable
// entries: a lookup is two loads and a string compare, an insert a single
// store, and concurrent users never block each other.
type pieceCache struct {
	slots []atomic.Pointer[cacheEntry]
	sets  uint64 // len(slots)/2, or 1 for a one-slot cache
	seed  maphash.Seed
}

func newPieceCache(size int) *pieceCache {
	c := &pieceCache{seed: maphash.MakeSeed()}
	if size == 1 {
		c.slots, c.sets = make([]atomic.Pointer[cacheEntry], 1), 1
		return c
	}
	// An odd size rounds down, so the cache never exceeds the requested bound.
	c.sets = uint64(size / 2)
	c.slots = make([]atomic.Pointer[cacheEntry], 2*c.sets)
	return c
}

// set maps a hash onto the index of its set's first slot. Multiply-shift
// avoids a division and works for any set count, not just powers of two.
func (c *pieceCache) set(h uint64) int {
	i := int((h >> 32) * c.sets >> 32)
	if len(c.slots) == 1 {
		return 0
	}
	return 2 * i
}

func (c *pieceCache) hash(piece string) uint64 {
	return maphash.String(c.seed, piece)
}

func (c *pieceCache) get(h uint64, piece string) ([]uint32, bool) {
	i := c.set(h)
	if e := c.slots[i].Load(); e != nil && e.key == piece {
		return e.ids, true
	}
	if len(c.slots) > 1 {
		if e := c.slots[i+1].Load(); e != nil && e.key == piece {
			return e.ids, true
		}
	}
	return nil, false
}

// put stores copies: the piece is a substring of the caller's text and must
// not keep that text alive, and ids is the caller's scratch buffer.
func (c *pieceCache) put(h uint64, piece string, ids []uint32) {
	e := &cacheEntry{key: strings.Clone(piece), ids: append([]uint32(nil), ids...)}
	i := c.set(h)
	if len(c.slots) > 1 {
		switch {
		case c.slots[i].Load() == nil:
		case c.slots[i+1].Load() == nil:
			i++
		default:
			i += int(h & 1) // the low bit is independent of the set index
		}
	}
	c.slots[i].Store(e)
}

// CacheStats describes an Encoder's piece cache.
type CacheStats struct {
	Slots    int // capacity: the cache never holds more entries than this
	Entries  int // slots currently occupied
	KeyBytes int // total bytes of cached pieces
	IDs      int // total token ids held by cached entries
}

func (c *pieceCache) stats() CacheStats {
	s := CacheStats{Slots: len(c.slots)}
	for i := range c.slots {
		if e := c.slots[i].Load(); e != nil {
			s.Entries++
			s.KeyBytes += len(e.key)
			s.IDs += len(e.ids)
		}
	}
	return s
}
