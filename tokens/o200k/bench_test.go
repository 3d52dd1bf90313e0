package o200k

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// benchSize is the text counted per benchmark operation, for every kind.
const benchSize = 128 << 10

var benchTexts = sync.OnceValue(func() map[string]string {
	m := map[string]string{}
	for _, k := range corpusKinds {
		m[k.name] = corpus(k.name, benchSize)
	}
	return m
})

// benchKinds lists the generated kinds plus "transcript" (real agent JSONL,
// the first benchSize bytes of every 16th line) when the data set exists.
func benchKinds(tb testing.TB) []string {
	texts := benchTexts()
	var kinds []string
	for _, k := range corpusKinds {
		kinds = append(kinds, k.name)
	}
	if _, ok := texts["transcript"]; ok {
		return append(kinds, "transcript")
	}
	lines := transcriptLines(tb)
	if len(lines) == 0 {
		return kinds
	}
	var b strings.Builder
	for i := 0; i < len(lines) && b.Len() < benchSize; i += 16 {
		b.WriteString(lines[i])
		b.WriteByte('\n')
	}
	texts["transcript"] = b.String()
	return append(kinds, "transcript")
}

// counter is one implementation under benchmark.
type counter struct {
	name  string
	count func(string) int
	setup func(text string) // warms a cache, or nothing
}

func counters(tb testing.TB) []counter {
	cold := uncached()
	warm, err := New()
	if err != nil {
		tb.Fatal(err)
	}
	ref := reference(tb)
	return []counter{
		{"ours-cold", cold.Count, func(string) {}},
		{"ours-warm", warm.Count, func(s string) { warm.Count(s) }},
		{"pkoukk", func(s string) int { return len(ref.Encode(s, nil, nil)) }, func(string) {}},
	}
}

// runCount counts text b.N times on the given number of goroutines and
// reports tokens per second across all of them.
func runCount(b *testing.B, c counter, text string, goroutines int) {
	c.setup(text)
	tokens := c.count(text)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	if goroutines == 1 {
		for i := 0; i < b.N; i++ {
			c.count(text)
		}
	} else {
		var next atomic.Int64
		var wg sync.WaitGroup
		for g := 0; g < goroutines; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= int64(b.N) {
					c.count(text)
				}
			}()
		}
		wg.Wait()
	}
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(tokens)*float64(b.N)/elapsed.Seconds(), "tok/s")
}

// BenchmarkCount measures every kind × implementation × goroutine count:
//
//	go test -run '^$' -bench Count ./tokens/o200k/
func BenchmarkCount(b *testing.B) {
	kinds := benchKinds(b)
	texts := benchTexts()
	cs := counters(b)
	for _, k := range kinds {
		for _, c := range cs {
			for _, g := range []int{1, 2} {
				b.Run(fmt.Sprintf("%s/%s/g%d", k, c.name, g), func(b *testing.B) {
					runCount(b, c, texts[k], g)
				})
			}
		}
	}
}

// BenchmarkCompare prints one table with tokens/s for ours (cold and warm
// cache) and pkoukk, single goroutine and two, and the speed-up ratios:
//
//	go test -run '^$' -bench Compare -v ./tokens/o200k/
//
// It times each cell itself (for at least compareTime) instead of nesting
// testing.Benchmark, which would deadlock inside a running benchmark.
func BenchmarkCompare(b *testing.B) {
	kinds := benchKinds(b)
	texts := benchTexts()
	cs := counters(b)
	var tab strings.Builder
	fmt.Fprintf(&tab, "\n%-10s %3s %12s %12s %12s %8s %8s  (tokens/s; GOMAXPROCS=%d)\n", "kind", "g", "ours-cold", "ours-warm", "pkoukk", "cold/pk", "warm/pk", runtime.GOMAXPROCS(0))
	for _, k := range kinds {
		for _, g := range []int{1, 2} {
			var rate [3]float64
			for i, c := range cs {
				rate[i] = measure(c, texts[k], g)
			}
			fmt.Fprintf(&tab, "%-10s %3d %12.0f %12.0f %12.0f %7.1fx %7.1fx\n", k, g, rate[0], rate[1], rate[2], rate[0]/rate[2], rate[1]/rate[2])
		}
	}
	b.Log(tab.String())
}

const compareTime = 700 * time.Millisecond

// measure counts text repeatedly on g goroutines for at least compareTime
// and returns the aggregate tokens per second.
func measure(c counter, text string, g int) float64 {
	c.setup(text)
	tokens := c.count(text)
	var ops atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < g; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(start) < compareTime {
				c.count(text)
				ops.Add(1)
			}
		}()
	}
	wg.Wait()
	return float64(tokens) * float64(ops.Load()) / time.Since(start).Seconds()
}

// genUnique produces text whose multi-token pieces are almost all new, so
// every one of them misses the cache and replaces an entry.
func genUnique(r *rand.Rand, size int) string {
	var b strings.Builder
	for b.Len() < size {
		b.WriteByte(' ')
		for n := r.IntN(10) + 5; n > 0; n-- {
			b.WriteByte(byte('a' + r.IntN(26)))
		}
		if r.IntN(8) == 0 {
			b.WriteString(pickRunes(r, hanzi, r.IntN(10)+2))
		}
	}
	return b.String()
}

// BenchmarkUniqueStream feeds 1 MiB of never-seen text per operation to one
// encoder with the default cache and reports live heap (after a GC) relative
// to the start: once after a 4 MiB warm-up that fills the cache, and again
// after all b.N MiB. The two stay equal however much text goes through,
// because the cache cannot grow past DefaultCacheSize entries:
//
//	go test -run '^$' -bench UniqueStream -benchtime 64x ./tokens/o200k/
func BenchmarkUniqueStream(b *testing.B) {
	enc, err := New()
	if err != nil {
		b.Fatal(err)
	}
	r := rand.New(rand.NewPCG(99, 1))
	live := func() float64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return float64(ms.HeapAlloc) / (1 << 20)
	}
	base := live()
	for i := 0; i < 4; i++ {
		enc.Count(genUnique(r, 1<<20))
	}
	filled := live()
	b.SetBytes(1 << 20)
	b.ResetTimer()
	peak := filled
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		text := genUnique(r, 1<<20)
		b.StartTimer()
		enc.Count(text)
		if i%16 == 15 {
			b.StopTimer()
			text = ""
			peak = max(peak, live())
			b.StartTimer()
		}
	}
	b.StopTimer()
	st := enc.CacheStats()
	if st.Entries > st.Slots || st.Slots != DefaultCacheSize {
		b.Fatalf("cache holds %d entries in %d slots, bound %d", st.Entries, st.Slots, DefaultCacheSize)
	}
	end := live()
	b.ReportMetric(filled-base, "MiB-live-after-4MiB")
	b.ReportMetric(end-base, "MiB-live-at-end")
	b.ReportMetric(peak-base, "MiB-live-peak")
	b.ReportMetric(float64(st.Entries), "cache-entries")
	runtime.KeepAlive(enc)
}
