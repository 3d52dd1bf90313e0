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

// pieceCache is a direct-mapped cache from piece to token ids. A new entry
// simply replaces whatever occupied its slot, which gives random eviction
// with no bookkeeping and a hard bound of one entry per slot. Slots are
// atomic pointers: a lookup is a load plus a string compare, an insert a
// single store, and concurrent users never block each other.
type pieceCache struct {
	slots []atomic.Pointer[cacheEntry]
	seed  maphash.Seed
}

func newPieceCache(size int) *pieceCache {
	return &pieceCache{slots: make([]atomic.Pointer[cacheEntry], size), seed: maphash.MakeSeed()}
}

// slot maps a hash onto [0, len(slots)) by multiply-shift, which avoids a
// division and works for any slot count, not just powers of two.
func (c *pieceCache) slot(h uint64) *atomic.Pointer[cacheEntry] {
	return &c.slots[(h>>32)*uint64(len(c.slots))>>32]
}

func (c *pieceCache) hash(piece string) uint64 {
	return maphash.String(c.seed, piece)
}

func (c *pieceCache) get(h uint64, piece string) ([]uint32, bool) {
	if e := c.slot(h).Load(); e != nil && e.key == piece {
		return e.ids, true
	}
	return nil, false
}

// put stores copies: the piece is a substring of the caller's text and must
// not keep that text alive, and ids is the caller's scratch buffer.
func (c *pieceCache) put(h uint64, piece string, ids []uint32) {
	c.slot(h).Store(&cacheEntry{key: strings.Clone(piece), ids: append([]uint32(nil), ids...)})
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
