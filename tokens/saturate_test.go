package tokens

import (
	"math"
	"strings"
	"testing"

	"github.com/ctxpipe/ctxpipe/schema"
)

// A float product converted to int past its range would be MinInt64 (a
// fudge_factor of 1e18 times any count). Profile validation refuses such a
// factor; the counter does not rely on that and saturates at MaxCount
// whatever it is given.
func TestCountsSaturate(t *testing.T) {
	huge := counterFunc(func(string) int { return math.MaxInt })
	negative := counterFunc(func(string) int { return -7 })
	text := func(s string) schema.Block { return schema.Block{Type: schema.BlockText, Text: s} }
	many := make([]schema.Block, 50)
	for i := range many {
		many[i] = text(strings.Repeat("w ", 10))
	}
	bigImage := schema.Block{Type: schema.BlockImage, Source: &schema.ImageSource{Type: "base64", Data: "AAAA"}}
	tests := []struct {
		name    string
		text    TextCounter
		fudge   float64
		content schema.Content
		want    int
	}{
		{"fudge 1e18", words{}, 1e18, schema.TextContent("one two"), MaxCount},
		{"fudge max float", words{}, math.MaxFloat64, schema.TextContent("one"), MaxCount},
		{"fudge +Inf", words{}, math.Inf(1), schema.TextContent("one two"), MaxCount},
		{"fudge NaN counts without a factor", words{}, math.NaN(), schema.TextContent("one two"), 2},
		{"fudge just under the cap", words{}, MaxCount - 1, schema.TextContent("one"), MaxCount - 1},
		{"huge text count", huge, 1, schema.TextContent("x"), MaxCount},
		{"huge text count, fudged", huge, 10, schema.TextContent("x"), MaxCount},
		{"huge counts summed over blocks", huge, 1, schema.BlockContent(text("a"), text("b"), text("c")), MaxCount},
		{"negative text count is zero", negative, 1.5, schema.TextContent("x"), 0},
		{"negative counts in blocks are zero", negative, 1.5, schema.BlockContent(text("a"), bigImage), 3}, // ceil(2×1.5)
		{"sum saturates, fudged", counterFunc(func(string) int { return MaxCount / 40 }), 10, schema.BlockContent(many...), MaxCount},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Counter{Text: tt.text, Fudge: tt.fudge}
			if got := c.Content(tt.content); got != tt.want {
				t.Errorf("Content = %d, want %d", got, tt.want)
			}
			if got := c.String("x y"); got < 0 || got > MaxCount {
				t.Errorf("String = %d, out of [0, MaxCount]", got)
			}
			if got := c.Blocks(tt.content.BlocksOf()); got < 0 || got > MaxCount {
				t.Errorf("Blocks = %d, out of [0, MaxCount]", got)
			}
		})
	}
}

// The counter a profile yields never goes negative, even for a profile that
// skipped validation, on a large real input.
func TestForProfileHugeFudge(t *testing.T) {
	for _, kind := range []schema.CounterKind{schema.CounterO200K, schema.CounterChars} {
		p := schema.Profile{ID: "p", ContextWindow: 1000, FudgeFactor: 1e18, Counter: kind}
		if p.Validate() == nil {
			t.Fatalf("profile with fudge_factor 1e18 validated")
		}
		c, err := ForProfile(&p)
		if err != nil {
			t.Fatal(err)
		}
		big := schema.TextContent(strings.Repeat("lorem ipsum dolor sit amet ", 40_000))
		if got := c.Content(big); got != MaxCount {
			t.Errorf("%s: Content = %d, want MaxCount", kind, got)
		}
	}
}

func TestCharsSaturates(t *testing.T) {
	if got := (Chars{}).Count("abcd"); got != 1 {
		t.Errorf("Chars(abcd) = %d", got)
	}
	if got := ImageTokens(&schema.ImageSource{Type: "base64", Data: strings.Repeat("A", 1<<20)}); got != 1024 {
		t.Errorf("ImageTokens(1 MiB) = %d", got)
	}
}
