package o200k

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// o200kPattern is the pre-tokenizer pattern as pkoukk/tiktoken-go builds it
// for o200k_base. Comparing piece boundaries with regexp2 directly is a
// sharper test of the scanner than comparing token ids: two different
// segmentations often merge into the same tokens.
var o200kPattern = strings.Join([]string{
	`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
	`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
	`\p{N}{1,3}`,
	` ?[^\s\p{L}\p{N}]+[\r\n/]*`,
	`\s*[\r\n]+`,
	`\s+(?!\S)`,
	`\s+`,
}, "|")

var pieceRegexp = regexp2.MustCompile(o200kPattern, regexp2.None)

// refPieces splits valid UTF-8 text with regexp2, as the reference does.
func refPieces(text string) []string {
	runes := []rune(text)
	var out []string
	m, _ := pieceRegexp.FindStringMatch(text)
	for m != nil {
		out = append(out, string(runes[m.Index:m.Index+m.Length]))
		m, _ = pieceRegexp.FindNextMatch(m)
	}
	return out
}

func ourPieces(text string) []string {
	if _, err := loadVocab(); err != nil { // builds the class table
		panic(err)
	}
	var out []string
	for i := 0; i < len(text); {
		j := nextPiece(text, i)
		out = append(out, text[i:j])
		i = j
	}
	return out
}

func pieceMismatch(text string) string {
	text = sanitize(text)
	got, want := ourPieces(text), refPieces(text)
	if slices.Equal(got, want) {
		return ""
	}
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	return fmt.Sprintf("pieces of %q differ at %d:\n got  %q\n want %q", clip(text), i, got[i:min(i+4, len(got))], want[i:min(i+4, len(want))])
}

func TestPiecesAdversarial(t *testing.T) {
	for _, s := range adversarial {
		if d := pieceMismatch(s); d != "" {
			t.Error(d)
		}
	}
	n := 50000
	if raceEnabled || testing.Short() {
		n = 5000
	}
	r := rand.New(rand.NewPCG(11, 12))
	bad := 0
	for i := 0; i < n && bad < 10; i++ {
		if d := pieceMismatch(randomText(r, 16)); d != "" {
			t.Error(d)
			bad++
		}
	}
	// Runes from anywhere in Unicode, so every category the tables know
	// about (Lt, Nl, No, Mc, Me, Cf, Co, unassigned, supplementary planes)
	// meets the scanner, mixed with the separators that shape pieces.
	for i := 0; i < n && bad < 10; i++ {
		var b strings.Builder
		for k := r.IntN(16) + 1; k > 0; k-- {
			switch r.IntN(4) {
			case 0:
				b.WriteString(alphabet[r.IntN(len(alphabet))])
			case 1:
				b.WriteRune(rune(r.IntN(0x3000)))
			default:
				b.WriteRune(rune(r.IntN(0x110000)))
			}
		}
		if d := pieceMismatch(b.String()); d != "" {
			t.Error(d)
			bad++
		}
	}
}

// FuzzPieces compares the scanner's segmentation with regexp2's.
func FuzzPieces(f *testing.F) {
	for _, s := range adversarial {
		if len(s) <= 4096 {
			f.Add(s)
		}
	}
	f.Fuzz(func(t *testing.T, s string) {
		if d := pieceMismatch(s); d != "" {
			t.Fatal(d)
		}
		// The pieces tile the (sanitized) text.
		if s = sanitize(s); strings.Join(ourPieces(s), "") != s || !utf8.ValidString(s) {
			t.Fatalf("pieces do not tile %q", s)
		}
	})
}
