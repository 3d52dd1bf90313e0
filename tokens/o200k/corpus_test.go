package o200k

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"unicode"
	"unicode/utf8"
)

// The corpus generators produce deterministic text of the kinds ctxpipe
// counts: prose, Go and TypeScript code, JSON tool output, CJK, and
// whitespace-heavy logs. They are shared by the corpus test and the
// benchmarks.

var proseWords = strings.Fields(`the of and to in is that it for on with as was be by this are at from
have not or an but which you they one all were we when your can there has more if will would about
their what so up out them some time could into only other then its also than these two first way
because people any new after most made through where much before right should well being system
model token context window request response agent conversation message summary cache budget limit
however although therefore meanwhile nevertheless approximately significantly straightforward
implementation configuration documentation infrastructure compatibility serialization
I you we they he she it don't can't won't isn't it's we're they've I'm she'll he'd you'd that's
OpenAI Kubernetes PostgreSQL JavaScript TypeScript GitHub macOS iPhone HTTP JSON API URL UTF-8`)

var syllables = strings.Fields(`ka zu mi ro te pa shi no ve lar qua tion ment ber fax gle plo wix
dro sna kri tor vel ing ous nix zor bly cre ath`)

// capitalize upper-cases the first rune (not byte: the corpus must stay
// valid UTF-8 so that benchmarks measure the common path).
func capitalize(w string) string {
	r, n := utf8.DecodeRuneInString(w)
	return string(unicode.ToUpper(r)) + w[n:]
}

func rareWord(r *rand.Rand) string {
	var b strings.Builder
	for n := r.IntN(3) + 2; n > 0; n-- {
		b.WriteString(syllables[r.IntN(len(syllables))])
	}
	return b.String()
}

func genProse(r *rand.Rand, size int) string {
	var b strings.Builder
	for b.Len() < size {
		words := r.IntN(18) + 4
		for i := 0; i < words; i++ {
			var w string
			switch x := r.IntN(100); {
			case x < 6:
				w = rareWord(r)
			case x < 9:
				w = fmt.Sprint(r.IntN(100000))
			case x < 10:
				w = []string{"😀", "🚀", "👩‍💻", "✅", "—", "“quoted”", "(aside)", "naïve", "café", "Zürich"}[r.IntN(10)]
			default:
				w = proseWords[r.IntN(len(proseWords))]
			}
			if i == 0 {
				w = capitalize(w)
			} else {
				b.WriteByte(' ')
			}
			b.WriteString(w)
			if i+1 < words && r.IntN(12) == 0 {
				b.WriteString([]string{",", ";", ":", " -", "'s"}[r.IntN(5)])
			}
		}
		b.WriteString([]string{".", "!", "?", "...", "."}[r.IntN(5)])
		if r.IntN(6) == 0 {
			b.WriteString("\n\n")
		} else {
			b.WriteByte(' ')
		}
	}
	return b.String()
}

func ident(r *rand.Rand, exported bool) string {
	var b strings.Builder
	for n := r.IntN(3) + 1; n > 0; n-- {
		var w string
		if r.IntN(2) == 0 {
			w = proseWords[r.IntN(120)]
		} else {
			w = syllables[r.IntN(len(syllables))]
		}
		if b.Len() > 0 || exported {
			w = capitalize(w)
		}
		b.WriteString(w)
	}
	return b.String()
}

func genGo(r *rand.Rand, size int) string {
	var b strings.Builder
	for b.Len() < size {
		name, recv, typ := ident(r, true), ident(r, false), ident(r, true)
		fmt.Fprintf(&b, "// %s returns the %s for %s, or an error if the %s is invalid.\n", name, ident(r, false), recv, ident(r, false))
		fmt.Fprintf(&b, "func (%c *%s) %s(ctx context.Context, %s []byte) (int, error) {\n", recv[0], typ, name, recv)
		for n := r.IntN(6) + 2; n > 0; n-- {
			switch r.IntN(5) {
			case 0:
				fmt.Fprintf(&b, "\tif err := %s.%s(ctx); err != nil {\n\t\treturn 0, fmt.Errorf(\"%s: %%w\", err)\n\t}\n", recv, ident(r, true), ident(r, false))
			case 1:
				fmt.Fprintf(&b, "\tfor i := 0; i < len(%s); i += %d {\n\t\t%s[i] ^= 0x%02x\n\t}\n", recv, r.IntN(64)+1, recv, r.IntN(256))
			case 2:
				fmt.Fprintf(&b, "\t%s := map[string]int{\"%s\": %d, \"%s\": %d}\n", ident(r, false), ident(r, false), r.IntN(1000), ident(r, false), r.IntN(1000))
			case 3:
				fmt.Fprintf(&b, "\n\t// TODO(%s): handle the %s case.\n", syllables[r.IntN(len(syllables))], ident(r, false))
			default:
				fmt.Fprintf(&b, "\tn += len(%s) * %d // %s\n", recv, r.IntN(9)+1, ident(r, false))
			}
		}
		b.WriteString("\treturn n, nil\n}\n\n")
	}
	return b.String()
}

func genTS(r *rand.Rand, size int) string {
	var b strings.Builder
	for b.Len() < size {
		typ := ident(r, true)
		fmt.Fprintf(&b, "export interface %s {\n  %s: string;\n  %s?: number[];\n  %s: Record<string, unknown>;\n}\n\n", typ, ident(r, false), ident(r, false), ident(r, false))
		fn := ident(r, false)
		fmt.Fprintf(&b, "export const %s = async (input: %s): Promise<%s | null> => {\n", fn, typ, typ)
		fmt.Fprintf(&b, "  const res = await fetch(`/api/v%d/${input.%s}`, { method: \"POST\" });\n", r.IntN(3)+1, ident(r, false))
		fmt.Fprintf(&b, "  if (!res.ok) {\n    throw new Error(`%s failed: ${res.status}`);\n  }\n", fn)
		fmt.Fprintf(&b, "  return (await res.json()) as %s; // %s\n};\n\n", typ, ident(r, false))
	}
	return b.String()
}

func genJSON(r *rand.Rand, size int) string {
	var b strings.Builder
	for b.Len() < size {
		fmt.Fprintf(&b, "{\n  \"id\": \"call_%08x%08x\",\n  \"type\": \"tool_result\",\n", r.Uint32(), r.Uint32())
		fmt.Fprintf(&b, "  \"path\": \"/usr/src/%s/%s.py\",\n  \"line\": %d,\n  \"ok\": %v,\n", ident(r, false), ident(r, false), r.IntN(5000), r.IntN(2) == 0)
		b.WriteString("  \"content\": \"")
		for n := r.IntN(6) + 1; n > 0; n-- {
			fmt.Fprintf(&b, "    def %s(self, %s=None):\\n        return self._%s\\n", ident(r, false), ident(r, false), ident(r, false))
		}
		fmt.Fprintf(&b, "\",\n  \"scores\": [%d, %.3f, -%d, %.1e],\n  \"tags\": {\"%s\": null, \"emoji\": \"\\ud83d\\ude00\"}\n},\n", r.IntN(100), r.Float64(), r.IntN(1000), r.Float64()*1e6, ident(r, false))
	}
	return b.String()
}

var (
	hanzi  = []rune("的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持音跑")
	kana   = []rune("あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをんアイウエオカキクケコサシスセソタチツテトナニヌネノ")
	hangul = []rune("가나다라마바사아자차카타파하한국어텍스트입니다는을를이가에서고")
)

func pickRunes(r *rand.Rand, set []rune, n int) string {
	out := make([]rune, n)
	for i := range out {
		out[i] = set[r.IntN(len(set))]
	}
	return string(out)
}

func genCJK(r *rand.Rand, size int) string {
	var b strings.Builder
	for b.Len() < size {
		switch r.IntN(4) {
		case 0, 1:
			b.WriteString(pickRunes(r, hanzi, r.IntN(14)+4))
			b.WriteString([]string{"，", "。", "！", "？", "、", "：「", "」"}[r.IntN(7)])
		case 2:
			b.WriteString(pickRunes(r, hanzi, r.IntN(3)+1))
			b.WriteString(pickRunes(r, kana, r.IntN(8)+2))
			b.WriteString("。")
		default:
			for n := r.IntN(5) + 2; n > 0; n-- {
				b.WriteString(pickRunes(r, hangul, r.IntN(4)+1))
				b.WriteByte(' ')
			}
			b.WriteString(". ")
		}
		if r.IntN(10) == 0 {
			b.WriteString("\n")
		}
	}
	return b.String()
}

func genLogs(r *rand.Rand, size int) string {
	var b strings.Builder
	levels := []string{"INFO ", "WARN ", "ERROR", "DEBUG"}
	for b.Len() < size {
		fmt.Fprintf(&b, "2025-%02d-%02dT%02d:%02d:%02d.%03dZ  %s  [worker-%d]\t%-28s path=/api/v1/%s  status=%d\tdur=%.1fms",
			r.IntN(12)+1, r.IntN(28)+1, r.IntN(24), r.IntN(60), r.IntN(60), r.IntN(1000), levels[r.IntN(4)], r.IntN(16),
			ident(r, false), ident(r, false), []int{200, 201, 404, 500}[r.IntN(4)], r.Float64()*300)
		switch r.IntN(6) {
		case 0:
			b.WriteString("   \r\n")
		case 1:
			fmt.Fprintf(&b, "\n    at %s (%s.ts:%d:%d)\n    at %s (node:internal/%s:%d)\n", ident(r, false), ident(r, false), r.IntN(900), r.IntN(80), ident(r, false), ident(r, false), r.IntN(900))
		case 2:
			b.WriteString("\n  \n\t\n")
		default:
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// corpusKinds is the benchmark and test menu. "mixed" interleaves the others
// in blocks, the way an agent transcript alternates prose, code and output.
var corpusKinds = []struct {
	name string
	gen  func(*rand.Rand, int) string
}{
	{"prose", genProse},
	{"code", func(r *rand.Rand, n int) string { return genGo(r, n/2) + genTS(r, n/2) }},
	{"json", genJSON},
	{"cjk", genCJK},
	{"logs", genLogs},
	{"mixed", genMixed},
}

func genMixed(r *rand.Rand, size int) string {
	gens := []func(*rand.Rand, int) string{genProse, genGo, genTS, genJSON, genCJK, genLogs}
	var b strings.Builder
	for b.Len() < size {
		b.WriteString(gens[r.IntN(len(gens))](r, r.IntN(3000)+200))
	}
	return b.String()
}

// corpus returns size bytes (or a little more) of the named kind,
// deterministically.
func corpus(kind string, size int) string {
	for i, k := range corpusKinds {
		if k.name == kind {
			return k.gen(rand.New(rand.NewPCG(uint64(i)+100, 42)), size)
		}
	}
	panic("unknown corpus kind " + kind)
}

// transcriptDir holds real agent transcripts when the shared data set is
// checked out next to the repository.
const transcriptDir = "../../../shared/data/transcripts"

// transcriptLines returns the raw JSONL lines of every transcript, or nil.
func transcriptLines(tb testing.TB) []string {
	files, _ := filepath.Glob(filepath.Join(transcriptDir, "*.jsonl"))
	var lines []string
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			tb.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		for sc.Scan() {
			lines = append(lines, sc.Text())
		}
		f.Close()
		if err := sc.Err(); err != nil {
			tb.Fatalf("%s: %v", name, err)
		}
	}
	return lines
}

// chunks cuts text at pseudo-random byte offsets, 1-16 KiB apart. Cuts may
// fall inside a UTF-8 sequence, which adds invalid-UTF-8 edges for free.
func chunks(text string, seed uint64) []string {
	r := rand.New(rand.NewPCG(seed, 7))
	var out []string
	for len(text) > 0 {
		n := min(r.IntN(16<<10)+1024, len(text))
		out = append(out, text[:n])
		text = text[n:]
	}
	return out
}

// compareAll checks every text against the reference on all cores and
// returns the number of mismatching texts and the tokens compared.
func compareAll(t *testing.T, enc *Encoder, texts []string) (bad, tokens int) {
	var mu sync.Mutex
	work := make(chan string)
	var wg sync.WaitGroup
	for w := 0; w < runtime.GOMAXPROCS(0); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := range work {
				d := mismatch(t, enc, s)
				n := enc.Count(s)
				mu.Lock()
				tokens += n
				if d != "" {
					bad++
					if bad <= 5 {
						t.Error(d)
					}
				}
				mu.Unlock()
			}
		}()
	}
	for _, s := range texts {
		work <- s
	}
	close(work)
	wg.Wait()
	return bad, tokens
}

func TestCorpusGenerated(t *testing.T) {
	per := 700 << 10 // ~4 MB over six kinds
	if raceEnabled || testing.Short() {
		per = 100 << 10
	}
	enc, err := New()
	if err != nil {
		t.Fatal(err)
	}
	var texts []string
	total := 0
	for i, k := range corpusKinds {
		text := corpus(k.name, per)
		total += len(text)
		texts = append(texts, chunks(text, uint64(i))...)
	}
	bad, tokens := compareAll(t, enc, texts)
	t.Logf("generated corpus: %d bytes, %d chunks, %d tokens, %d mismatching chunks", total, len(texts), tokens, bad)
}

func TestCorpusTranscripts(t *testing.T) {
	lines := transcriptLines(t)
	if len(lines) == 0 {
		t.Fatalf("no transcripts under %s (the tests expect ../shared beside the repo)", transcriptDir)
	}
	// Under the race detector, or with -short, compare every 8th line
	// (about 1 MB); otherwise all of them.
	if raceEnabled || testing.Short() {
		var some []string
		for i := 0; i < len(lines); i += 8 {
			some = append(some, lines[i])
		}
		lines = some
	}
	enc, err := New()
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, l := range lines {
		total += len(l)
	}
	bad, tokens := compareAll(t, enc, lines)
	t.Logf("transcripts: %d lines, %d bytes, %d tokens, %d mismatching lines", len(lines), total, tokens, bad)
}
