package o200k

import (
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"
)

// Encoder counts and encodes o200k_base tokens. It is safe for concurrent
// use by any number of goroutines.
type Encoder struct {
	v     *vocab
	cache *pieceCache // nil when caching is disabled
}

// Option configures New.
type Option func(*config)

type config struct {
	cacheSize int
}

// WithCacheSize sets the number of pieces the encoder's cache can hold. The
// cache never grows beyond n entries, each of at most CacheEntryMaxBytes, and
// n <= 0 disables it. Counting results do not depend on the cache.
func WithCacheSize(n int) Option {
	return func(c *config) { c.cacheSize = n }
}

// New returns an Encoder with its own piece cache. The ranks are parsed on
// the first call and shared afterwards, so later calls are cheap. The error
// is non-nil only if the embedded rank file is unreadable or corrupt.
func New(opts ...Option) (*Encoder, error) {
	cfg := config{cacheSize: DefaultCacheSize}
	for _, o := range opts {
		o(&cfg)
	}
	v, err := loadVocab()
	if err != nil {
		return nil, err
	}
	e := &Encoder{v: v}
	if cfg.cacheSize > 0 {
		e.cache = newPieceCache(cfg.cacheSize)
	}
	return e, nil
}

var (
	defaultOnce sync.Once
	defaultEnc  *Encoder
)

// Default returns a shared Encoder with the default cache size, created on
// first use. It panics only if the embedded ranks are corrupt, which would be
// a build problem rather than a run-time condition.
func Default() *Encoder {
	defaultOnce.Do(func() {
		e, err := New()
		if err != nil {
			panic(fmt.Sprintf("o200k: %v", err))
		}
		defaultEnc = e
	})
	return defaultEnc
}

// Count returns the number of o200k_base tokens in text, exactly as
// tiktoken encodes it with no special tokens allowed: special-token literals
// count as ordinary text and invalid UTF-8 bytes as U+FFFD. It does not
// allocate for valid UTF-8.
func (e *Encoder) Count(text string) int {
	_, n := e.encode(text, nil, false)
	return n
}

// Encode returns the o200k_base token ids of text. Special-token literals
// such as "<|endoftext|>" are encoded as ordinary text.
func (e *Encoder) Encode(text string) []int {
	out, _ := e.encode(text, make([]int, 0, len(text)/3+1), true)
	return out
}

// CacheStats reports the state of the encoder's piece cache; it is zero when
// the cache is disabled. It walks every slot, so it is meant for tests and
// diagnostics rather than the hot path.
func (e *Encoder) CacheStats() CacheStats {
	if e.cache == nil {
		return CacheStats{}
	}
	return e.cache.stats()
}

// UpperBound returns a number of tokens that text can never exceed, without
// tokenizing it. o200k_base is a byte-level BPE: every token stands for at
// least one byte, so n bytes make at most n tokens. The bytes that get
// tokenized are those of text after each invalid UTF-8 byte has been
// replaced by U+FFFD (three bytes), so for invalid input the bound adds two
// per invalid byte; for valid UTF-8 it is exactly len(text). The validity
// check runs at memory speed.
func UpperBound(text string) int {
	if utf8.ValidString(text) {
		return len(text)
	}
	n := 0
	for i := 0; i < len(text); {
		r, w := utf8.DecodeRuneInString(text[i:])
		if r == utf8.RuneError && w == 1 {
			n += 3
		} else {
			n += w
		}
		i += w
	}
	return n
}

// sanitize makes text valid UTF-8 the way the reference does. It converts
// text to []rune and back, which replaces every byte that does not belong to
// a valid sequence with U+FFFD; this builds the same string in one pass
// without the intermediate []rune. Valid text (the normal case) is returned
// as is, without copying.
func sanitize(text string) string {
	if utf8.ValidString(text) {
		return text
	}
	var b strings.Builder
	b.Grow(len(text) + 16)
	for i := 0; i < len(text); {
		r, n := utf8.DecodeRuneInString(text[i:])
		if r == utf8.RuneError && n == 1 {
			b.WriteString("\uFFFD")
		} else {
			b.WriteString(text[i : i+n])
		}
		i += n
	}
	return b.String()
}

// encode walks the pieces of text, appending ids to out when wantIDs is set,
// and returns the token count. Counting and encoding share this loop so they
// cannot disagree.
func (e *Encoder) encode(text string, out []int, wantIDs bool) ([]int, int) {
	text = sanitize(text)
	v := e.v
	count := 0
	var scratch [smallPiece]uint32
	for i := 0; i < len(text); {
		lo, hi := i, nextPiece(text, i)
		piece := text[lo:hi]
		i = hi
		// Most pieces are a single token: one table lookup and done.
		if id := v.rankOf(text, lo, hi); id != noRank {
			count++
			if wantIDs {
				out = append(out, int(id))
			}
			continue
		}
		var ids []uint32
		if e.cache != nil && len(piece) <= maxCachedPiece {
			h := e.cache.hash(piece)
			cached, ok := e.cache.get(h, piece)
			if ok {
				ids = cached
			} else {
				ids = scratch[:v.merge(text, lo, hi, scratch[:len(piece)])]
				e.cache.put(h, piece, ids)
			}
		} else if len(piece) <= smallPiece {
			ids = scratch[:v.merge(text, lo, hi, scratch[:len(piece)])]
		} else {
			big := make([]uint32, len(piece))
			ids = big[:v.merge(text, lo, hi, big)]
		}
		count += len(ids)
		if wantIDs {
			for _, id := range ids {
				out = append(out, int(id))
			}
		}
	}
	return out, count
}
