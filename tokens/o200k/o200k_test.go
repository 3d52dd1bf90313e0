package o200k

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"unicode"
	"unicode/utf8"

	tiktoken_loader "github.com/pkoukk/tiktoken-go-loader"
)

func TestAdversarialTable(t *testing.T) {
	cached, err := New()
	if err != nil {
		t.Fatal(err)
	}
	for _, enc := range []*Encoder{uncached(), cached, cached} { // cached twice: cold, then warm
		for _, s := range adversarial {
			if d := mismatch(t, enc, s); d != "" {
				t.Error(d)
			}
		}
	}
}

// Known answers pin behaviour that must not drift even if the reference
// library changed: "\n \n" is one piece (and one token), and special-token
// literals are plain text.
func TestKnownAnswers(t *testing.T) {
	enc := Default()
	for _, c := range []struct {
		text string
		want []int
	}{
		{"\n \n", []int{47812}},
		{"<|endoftext|>", []int{27, 91, 419, 1440, 919, 91, 29}},
		{"hello world's", []int{24912, 30226}},
		{"\xff", []int{3251}},
	} {
		got := enc.Encode(c.text)
		if !equalInts(got, c.want) {
			t.Errorf("Encode(%q) = %v, want %v", c.text, got, c.want)
		}
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// alphabet mixes one or more runes of every class the scanner distinguishes,
// so random strings over it hit the alternation and backtracking corners far
// more often than natural text does.
var alphabet = []string{
	" ", " ", " ", "\t", "\n", "\r", "\r\n", "\u00a0", "\u2028", "\u3000", "\v", "\f", "\u0085", "\u200b",
	"a", "b", "e", "z", "A", "Z", "s", "S", "t", "l", "L", "d", "m", "r", "v", "'", "'", "’",
	"0", "7", "٣", "Ⅻ", "²", "𝟏",
	"\u0301", "\u0903", "\u20dd", "ǅ", "ʰ", "ſ", "K", "İ", "ß", "é", "É", "𝐀", "𝐚",
	"中", "文", "한", "ア", "ا", "ש", "Ж", "ж", "ก",
	"😀", "\u200d", "🏽", "\U000E0041",
	".", ",", "!", "/", "/", "<", "|", ">", "_", "-", "{", "}", "\"", "\\", "$", "€",
	"\xff", "\xe2\x82", "\x00", "\x7f",
	"<|endoftext|>", "hello", "World", "the", "HTTP",
}

func randomText(r *rand.Rand, maxParts int) string {
	var b strings.Builder
	for n := r.IntN(maxParts) + 1; n > 0; n-- {
		b.WriteString(alphabet[r.IntN(len(alphabet))])
	}
	return b.String()
}

func TestRandomAdversarial(t *testing.T) {
	n := 20000
	if raceEnabled || testing.Short() {
		n = 3000
	}
	r := rand.New(rand.NewPCG(1, 2))
	enc := uncached()
	bad := 0
	for i := 0; i < n && bad < 10; i++ {
		s := randomText(r, 24)
		if i%4 == 3 { // any rune at all, including unassigned and private use
			var b strings.Builder
			for k := r.IntN(12) + 1; k > 0; k-- {
				b.WriteRune(rune(r.IntN(0x110000)))
				b.WriteString(alphabet[r.IntN(len(alphabet))])
			}
			s = b.String()
		}
		if d := mismatch(t, enc, s); d != "" {
			t.Error(d)
			bad++
		}
	}
}

// FuzzCount checks ids, Count and UpperBound against the reference. The seed
// corpus is the adversarial table, so plain `go test` runs it quickly.
func FuzzCount(f *testing.F) {
	for _, s := range adversarial {
		if len(s) <= 4096 { // long seeds make each fuzz iteration slow
			f.Add(s)
		}
	}
	enc := uncached()
	f.Fuzz(func(t *testing.T, s string) {
		if d := mismatch(t, enc, s); d != "" {
			t.Fatal(d)
		}
		if n, ub := enc.Count(s), UpperBound(s); n > ub {
			t.Fatalf("Count=%d > UpperBound=%d for %q", n, ub, s)
		}
	})
}

func TestUpperBound(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	enc := Default()
	check := func(s string) {
		if n, ub := enc.Count(s), UpperBound(s); n > ub {
			t.Fatalf("Count=%d > UpperBound=%d for %q", n, ub, s)
		}
	}
	for _, s := range adversarial {
		check(s)
	}
	for i := 0; i < 20000; i++ {
		check(randomText(r, 40))
		// Random bytes: mostly invalid UTF-8, where the bound must include
		// the U+FFFD expansion.
		b := make([]byte, r.IntN(40))
		for j := range b {
			b[j] = byte(r.UintN(256))
		}
		check(string(b))
	}
	if got := UpperBound("hello"); got != 5 {
		t.Errorf("UpperBound(hello) = %d, want 5", got)
	}
	if got := UpperBound("a\xffb"); got != 5 {
		t.Errorf("UpperBound(a\\xffb) = %d, want 5 (the invalid byte becomes 3 bytes)", got)
	}
}

// TestContractionFolding justifies the ASCII-only case folding in
// contraction: the reference lower-cases each input rune with
// unicode.ToLower, and no rune outside ASCII lower-cases to a character of
// the contraction patterns.
func TestContractionFolding(t *testing.T) {
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if l := unicode.ToLower(r); strings.ContainsRune("'strevmld", l) && r >= utf8.RuneSelf {
			t.Errorf("%U lower-cases to %q; contraction must handle it", r, l)
		}
	}
}

// TestClassTable checks the 64 KiB table against direct computation, i.e.
// that it was built before use and covers the whole BMP.
func TestClassTable(t *testing.T) {
	if _, err := loadVocab(); err != nil {
		t.Fatal(err)
	}
	for r := rune(0); r < 0x10000; r++ {
		if bmpClass[r] != classOf(r) {
			t.Fatalf("bmpClass[%U] = %b, want %b", r, bmpClass[r], classOf(r))
		}
	}
}

// naiveMerge is an independent oracle for the merge: tiktoken's algorithm
// written as plainly as possible over the loader's own map, so it shares
// neither the rank tables nor the merge code with the package.
func naiveMerge(ranks map[string]int, piece string) []uint32 {
	bounds := make([]int, len(piece)+1) // part i is piece[bounds[i]:bounds[i+1]]
	for i := range bounds {
		bounds[i] = i
	}
	for {
		best, at := -1, -1
		for i := 0; i+2 < len(bounds); i++ {
			if r, ok := ranks[piece[bounds[i]:bounds[i+2]]]; ok && (best < 0 || r < best) {
				best, at = r, i
			}
		}
		if at < 0 {
			break
		}
		bounds = append(bounds[:at+1], bounds[at+2:]...)
	}
	out := make([]uint32, len(bounds)-1)
	for i := range out {
		out[i] = uint32(ranks[piece[bounds[i]:bounds[i+1]]])
	}
	return out
}

var loaderRanks = sync.OnceValue(func() map[string]int {
	m, err := tiktoken_loader.NewOfflineLoader().LoadTiktokenBpe(rankFile)
	if err != nil {
		panic(err)
	}
	return m
})

// TestMerge checks both merge algorithms, and with them the packed rank
// tables, against naiveMerge on random pieces of 2 to 300 bytes.
func TestMerge(t *testing.T) {
	v, err := loadVocab()
	if err != nil {
		t.Fatal(err)
	}
	ranks := loaderRanks()
	r := rand.New(rand.NewPCG(5, 6))
	words := []string{"a", "b", "an", "the", "ing", "ation", "中", "文", "天气", "😀", " ", "1", "x", "\xff", "é", "e", "=", "\x00", "ab\x00"}
	n := 20000
	if raceEnabled || testing.Short() {
		n = 3000
	}
	for i := 0; i < n; i++ {
		limit := 40
		if i%40 == 0 {
			limit = 300
		}
		var b strings.Builder
		for b.Len() < limit && r.IntN(limit/3) != 0 {
			b.WriteString(words[r.IntN(len(words))])
		}
		p := b.String()
		if len(p) < 2 {
			continue
		}
		want := naiveMerge(ranks, p)
		got := make([]uint32, len(p))
		if len(p) <= linearMax {
			if k := v.mergeLinear(p, 0, len(p), got); !equalU32(got[:k], want) {
				t.Fatalf("piece %q: linear %v, want %v", p, got[:k], want)
			}
		}
		if k := v.mergeLarge(p, 0, len(p), got); !equalU32(got[:k], want) {
			t.Fatalf("piece %q: heap %v, want %v", p, got[:k], want)
		}
	}
}

// TestRankTables checks every token's id through rankOf, and a sample of
// non-tokens, against the loader's map.
func TestRankTables(t *testing.T) {
	v, err := loadVocab()
	if err != nil {
		t.Fatal(err)
	}
	ranks := loaderRanks()
	for tok, id := range ranks {
		if got := v.rankOf(tok, 0, len(tok)); got != uint32(id) {
			t.Fatalf("rankOf(%q) = %d, want %d", tok, got, id)
		}
		// A token with one byte changed or appended is usually not a token.
		for _, alt := range []string{tok + "\x00", tok[:len(tok)-1] + "\x00", "\x00" + tok} {
			want, ok := ranks[alt]
			got := v.rankOf(alt, 0, len(alt))
			if (got != noRank) != ok || (ok && got != uint32(want)) {
				t.Fatalf("rankOf(%q) = %d, want %d (present %v)", alt, got, want, ok)
			}
		}
	}
}

func equalU32(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestCacheBound streams unique text through a small cache and checks that it
// never holds more than its slot count nor more bytes than the documented
// per-slot bound, and that counts stay identical to the uncached encoder.
func TestCacheBound(t *testing.T) {
	const slots = 1000
	enc, err := New(WithCacheSize(slots))
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(7, 8))
	for i := 0; i < 2000; i++ {
		var b strings.Builder
		for j := 0; j < 50; j++ {
			// Unique multi-token words keep missing the cache.
			b.WriteString(" zq")
			for k := r.IntN(8) + 3; k > 0; k-- {
				b.WriteByte(byte('a' + r.IntN(26)))
			}
			b.WriteString("中文")
		}
		s := b.String()
		if got, want := enc.Count(s), uncached().Count(s); got != want {
			t.Fatalf("cached Count=%d, uncached %d for %q", got, want, s)
		}
	}
	st := enc.CacheStats()
	if st.Slots != slots || st.Entries > slots || st.Entries == 0 {
		t.Fatalf("stats %+v: want %d slots, 0 < entries <= slots", st, slots)
	}
	if st.KeyBytes > st.Entries*maxCachedPiece || st.IDs > st.Entries*maxCachedPiece {
		t.Fatalf("stats %+v exceed the per-entry bound", st)
	}
	if z, _ := New(WithCacheSize(0)); z.CacheStats() != (CacheStats{}) {
		t.Fatalf("disabled cache reports %+v", z.CacheStats())
	}
}

// TestConcurrent shares one cached encoder between goroutines; under -race
// this also checks the cache's publication protocol.
func TestConcurrent(t *testing.T) {
	enc, err := New(WithCacheSize(64)) // tiny, so goroutines keep replacing each other's entries
	if err != nil {
		t.Fatal(err)
	}
	texts := make([]string, 200)
	want := make([]int, len(texts))
	r := rand.New(rand.NewPCG(9, 10))
	for i := range texts {
		texts[i] = randomText(r, 60)
		want[i] = uncached().Count(texts[i])
	}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for round := 0; round < 20; round++ {
				for i := range texts {
					k := (i + g*37) % len(texts)
					if got := enc.Count(texts[k]); got != want[k] {
						t.Errorf("goroutine %d: Count(%q) = %d, want %d", g, texts[k], got, want[k])
						return
					}
				}
			}
		}(g)
	}
	wg.Wait()
}

func TestCountDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation behaviour")
	}
	enc := uncached()
	text := strings.Repeat("The quick brown fox's jumps 1234 over 中文 lazy dogs!\n\t", 20) +
		strings.Repeat("今天天气很好我们去公园散步然后回家吃饭。", 5) // CJK clauses are long pieces
	if a := testing.AllocsPerRun(20, func() { enc.Count(text) }); a != 0 {
		t.Errorf("Count allocates %.1f times per call", a)
	}
	warm := Default()
	warm.Count(text)
	if a := testing.AllocsPerRun(20, func() { warm.Count(text) }); a != 0 {
		t.Errorf("warm cached Count allocates %.1f times per call", a)
	}
}

func TestSanitizeMatchesRuneConversion(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	for i := 0; i < 20000; i++ {
		b := make([]byte, r.IntN(24))
		for j := range b {
			b[j] = byte(r.UintN(256))
			if r.IntN(3) == 0 {
				pool := "a\xe2\x82\xac\xf0\x9f\x98\x80\xed\xa0"
				b[j] = pool[r.IntN(len(pool))]
			}
		}
		if got, want := sanitize(string(b)), string([]rune(string(b))); got != want {
			t.Fatalf("sanitize(%q) = %q, want %q", b, got, want)
		}
	}
}

func TestCacheSizeIsABound(t *testing.T) {
	for _, n := range []int{1, 2, 3, 7, 1000, 1001} {
		enc, err := New(WithCacheSize(n))
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 3*n+10; i++ {
			enc.Count(fmt.Sprintf(" zqx%dqv 中文%d", i, i))
		}
		if st := enc.CacheStats(); st.Slots > n || st.Entries > n || st.Entries == 0 {
			t.Errorf("WithCacheSize(%d): %+v", n, st)
		}
	}
}
