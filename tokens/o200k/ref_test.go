package o200k

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	tiktoken "github.com/pkoukk/tiktoken-go"
	tiktoken_loader "github.com/pkoukk/tiktoken-go-loader"
)

// The reference is pkoukk/tiktoken-go with the offline loader, encoding with
// no special tokens allowed or disallowed.
var (
	refOnce sync.Once
	refEnc  *tiktoken.Tiktoken
	refErr  error
)

func reference(tb testing.TB) *tiktoken.Tiktoken {
	tb.Helper()
	refOnce.Do(func() {
		tiktoken.SetBpeLoader(tiktoken_loader.NewOfflineLoader())
		refEnc, refErr = tiktoken.GetEncoding("o200k_base")
	})
	if refErr != nil {
		tb.Fatalf("reference encoder: %v", refErr)
	}
	return refEnc
}

func refEncode(tb testing.TB, text string) []int {
	return reference(tb).Encode(text, nil, nil)
}

// uncached is an encoder without a cache, so every piece goes through the
// scanner and the merge loop.
var uncached = sync.OnceValue(func() *Encoder {
	e, err := New(WithCacheSize(0))
	if err != nil {
		panic(err)
	}
	return e
})

// mismatch compares our ids with the reference's and describes the first
// difference, or returns "" when they agree.
func mismatch(tb testing.TB, enc *Encoder, text string) string {
	want := refEncode(tb, text)
	got := enc.Encode(text)
	if slices.Equal(got, want) {
		if n := enc.Count(text); n != len(want) {
			return fmt.Sprintf("Count=%d but reference has %d tokens for %q", n, len(want), clip(text))
		}
		return ""
	}
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	ref := reference(tb)
	return fmt.Sprintf("text %q:\n first difference at token %d\n got  %v %q\n want %v %q",
		clip(text), i, window(got, i), ref.Decode(window(got, i)), window(want, i), ref.Decode(window(want, i)))
}

func window(ids []int, i int) []int {
	lo, hi := max(i-3, 0), min(i+5, len(ids))
	if lo > hi {
		return nil
	}
	return ids[lo:hi]
}

func clip(s string) string {
	if len(s) > 300 {
		return s[:150] + " … " + s[len(s)-150:]
	}
	return s
}

// adversarial holds the inputs named in the package requirements, plus
// cases that exercise each backtracking rule of the scanner.
var adversarial = []string{
	"", " ", "  ", "\t", "\n", "\r\n", "\n \n", "\n\t\n", " \n", "\n ", "a\n \nb", "x \n \n y",
	"   hello", "hello   ", "hello   world", "hello \t world", "a\u00a0\u00a0b", "a\u2028b", "a\u3000\u3000b",
	"\u00a0x", "\u3000x", "\u2028\u2029", "\v\f\u0085", "line1\r\n\r\nline3\r\n", "  \r\n  \r\n  x",
	"\t\tindented\n\t\t\tmore\n", "trailing   \n", "spaces only    ", " \t \t\n \t x",
	"1", "12", "123", "1234", "1234567", "3.14159", "1,000,000", "٣٤٥٦", "Ⅻ²³", "x1y22z333", "v1.2.3-rc4",
	"it's", "IT'S", "It'S", "we'll", "WE'LL", "We'Ll", "they're", "I've", "I'M", "she'd", "don't", "'s", "'S", "''", "a''s",
	"rock'n'roll", "O'Neil's", "x'", "x'l", "x'LLy", "ABC'S", "ABCdef's", "ǅemal's", "ſ's", "K's",
	"hello, world!", "wait... what?!", "---===+++", "a/b/c", "path/to/file.go", "x+\n/y", " {\n", "}\n\n", "();\r\n/",
	"😀", "👩‍👩‍👧‍👦", "👍🏽", "🇺🇸🇬🇧", "a😀b", " 😀😀", "\u200d", "a\u200db",
	"e\u0301", "\u0301", "\u0301abc", " \u0301", "\u0301.", "\u0301AB.", "AB\u0301", "Ab\u0301c", "ÉCOLE", "École", "naïve café",
	"中文分词测试", "今天天气很好，我们去公园吧。", "日本語のテキスト、カタカナ", "한국어 텍스트입니다", "مرحبا بالعالم", "שלום עולם", "Привет, мир", "ΑΒΓ αβγ",
	"हिन्दी", "ภาษาไทย", "𝐀𝐁𝐂𝐚𝐛𝐜", "𝟏𝟐𝟑𝟒", "\U000E0001\U000E0041",
	"\xff", "\xff\xfe", "a\xffb", " \xff", "\xe2\x82", "\xe2\x82\xac", "\xed\xa0\x80", "\xc0\xaf", "\xf4\x90\x80\x80", "abc\x80def", "\x00\x01\x1f\x7f",
	"<|endoftext|>", "<|endofprompt|>", "text<|endoftext|>more", " <|endoftext|> ", "<|fim_prefix|>", "<|im_start|>user\nhi<|im_end|>",
	strings.Repeat("a", 10000), strings.Repeat("abc", 3400), strings.Repeat("A", 5000), strings.Repeat("中", 4000),
	strings.Repeat(" ", 1000) + "x", strings.Repeat("\n", 500), strings.Repeat("!", 3000), strings.Repeat("9", 1000),
	strings.Repeat("ab1", 1000), strings.Repeat("\xff", 300), strings.Repeat("😀", 500), strings.Repeat("e\u0301", 700),
	"supercalifragilisticexpialidocious", "ThisIsCamelCaseIdentifier", "snake_case_identifier", "SCREAMING_SNAKE",
	"func main() {\n\tfmt.Println(\"hi\")\n}\n", `{"key": "value", "n": [1, 2, 3], "nested": {"ok": true}}`,
}
