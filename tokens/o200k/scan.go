package o200k

import (
	"unicode"
	"unicode/utf8"
)

// The o200k_base pre-tokenizer is this pattern (alternatives joined by "|"):
//
//	1  [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//	2  [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//	3  \p{N}{1,3}
//	4   ?[^\s\p{L}\p{N}]+[\r\n/]*
//	5  \s*[\r\n]+
//	6  \s+(?!\S)
//	7  \s+
//
// Every character starts a match of some alternative (letters match 1 or 2,
// numbers 3, other non-space characters 4, spaces 5-7) and no alternative can
// match the empty string, so the matches tile the text and the scanner only
// has to find where the match starting at a given offset ends. Each
// alternative below returns exactly the end a backtracking engine would
// report: the first success in the order greedy quantifiers give characters
// back.

// Character class bits. A rune's class byte is the OR of the sets it is in.
const (
	cLetter  uint8 = 1 << iota // \p{L}
	cNumber                    // \p{N}
	cSpace                     // \s, which regexp2 defines as unicode.IsSpace
	cUpper                     // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
	cLower                     // [\p{Ll}\p{Lm}\p{Lo}\p{M}]
	cNewline                   // \r or \n
)

// notPrefix are the bits that exclude a rune from [^\r\n\p{L}\p{N}], the
// optional one-character prefix of alternatives 1 and 2.
const notPrefix = cLetter | cNumber | cNewline

// notPunct are the bits that exclude a rune from [^\s\p{L}\p{N}], the body
// of alternative 4.
const notPunct = cSpace | cLetter | cNumber

// asciiClass is consulted for bytes below utf8.RuneSelf, the common case.
var asciiClass = func() (t [utf8.RuneSelf]uint8) {
	for i := range t {
		t[i] = classOf(rune(i))
	}
	return t
}()

// bmpClass caches classOf for the Basic Multilingual Plane (64 KiB). It is
// filled by buildClassTable under vocabOnce, before any Encoder can read it;
// computing it eagerly in init would tax every program that merely links the
// package.
var bmpClass [0x10000]uint8

func buildClassTable() {
	for r := range bmpClass {
		bmpClass[r] = classOf(rune(r))
	}
}

// classOf computes a rune's class from the unicode tables, using the same
// predicates as regexp2 (unicode.Is on the category tables, unicode.IsSpace
// for \s) so that the scanner and the reference agree on every rune.
func classOf(r rune) uint8 {
	var c uint8
	if unicode.Is(unicode.L, r) {
		c |= cLetter
	}
	if unicode.Is(unicode.N, r) {
		c |= cNumber
	}
	if unicode.IsSpace(r) {
		c |= cSpace
	}
	m := unicode.Is(unicode.M, r)
	if m || unicode.Is(unicode.Lu, r) || unicode.Is(unicode.Lt, r) || unicode.Is(unicode.Lm, r) || unicode.Is(unicode.Lo, r) {
		c |= cUpper
	}
	if m || unicode.Is(unicode.Ll, r) || unicode.Is(unicode.Lm, r) || unicode.Is(unicode.Lo, r) {
		c |= cLower
	}
	if r == '\r' || r == '\n' {
		c |= cNewline
	}
	return c
}

// classAt returns the class of the rune starting at s[i] and its width.
// s must be valid UTF-8 (the encoder sanitizes input first), and i < len(s).
func classAt(s string, i int) (uint8, int) {
	b := s[i]
	if b < utf8.RuneSelf {
		return asciiClass[b], 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	if r < 0x10000 {
		return bmpClass[r], n
	}
	return classOf(r), n
}

// nextPiece returns the end of the pre-tokenizer match that starts at s[i].
// s must be valid UTF-8 and i < len(s).
func nextPiece(s string, i int) int {
	c, n := classAt(s, i)

	// Fast path for the most common piece: a run of ASCII lower-case letters,
	// optionally after a space, ending in ASCII that is neither a letter nor
	// a mark. It is what alternative 1 returns for such input; anything else
	// falls through to the general code.
	if c&(cLower|cSpace) != 0 && s[i] < utf8.RuneSelf {
		j := i
		if s[j] == ' ' {
			j++
		}
		k := j
		for k < len(s) && s[k]-'a' < 26 {
			k++
		}
		if k > j && (k == len(s) || (s[k] < utf8.RuneSelf && asciiClass[s[k]]&(cUpper|cLower) == 0)) {
			return contraction(s, k)
		}
	}

	// Alternatives 1 and 2, each tried first with the optional prefix
	// consumed and then without it, in the engine's order.
	prefix := c&notPrefix == 0
	if prefix {
		if e := upperThenLower(s, i+n); e >= 0 {
			return e
		}
	}
	if c&(cUpper|cLower) != 0 {
		if e := upperThenLower(s, i); e >= 0 {
			return e
		}
	}
	if prefix {
		if e := upperRun(s, i+n); e >= 0 {
			return e
		}
	}
	if c&cUpper != 0 {
		if e := upperRun(s, i); e >= 0 {
			return e
		}
	}

	// Alternative 3: one to three numeric characters.
	if c&cNumber != 0 {
		j := i + n
		for k := 1; k < 3 && j < len(s); k++ {
			c2, n2 := classAt(s, j)
			if c2&cNumber == 0 {
				break
			}
			j += n2
		}
		return j
	}

	// Alternative 4: an optional ASCII space, a run of characters that are
	// not space, letter or number, then any \r, \n or '/'. If the space is
	// not followed by such a character the space is given back, and the
	// space itself cannot start the run, so the alternative fails.
	if s[i] == ' ' && i+1 < len(s) {
		if c2, _ := classAt(s, i+1); c2&notPunct == 0 {
			return punctRun(s, i+1)
		}
	}
	if c&notPunct == 0 {
		return punctRun(s, i)
	}

	// Only white space is left. Alternatives 5-7 all start by consuming the
	// whole run of white space at i.
	j, last, lastNewline := i, i, -1
	for j < len(s) {
		c2, n2 := classAt(s, j)
		if c2&cSpace == 0 {
			break
		}
		if c2&cNewline != 0 {
			lastNewline = j
		}
		last = j
		j += n2
	}
	// 5: \s* gives back characters until [\r\n]+ can match; that first
	// happens at the last \r or \n of the run, and [\r\n]+ then takes just
	// that one character because nothing after it in the run is \r or \n.
	if lastNewline >= 0 {
		return lastNewline + 1
	}
	// 6: at the end of the text the look-ahead succeeds on the whole run.
	// Otherwise a non-space follows, so \s+ gives back one character and the
	// look-ahead then sees a space; that needs a run of two or more.
	if j < len(s) && last > i {
		return last
	}
	// 7: the whole run (a single space before a non-space, or the text end).
	return j
}

// upperThenLower matches [Upper]*[Lower]+ (contraction)? at s[i:], returning
// the end or -1. Upper is {Lu,Lt,Lm,Lo,M} and Lower is {Ll,Lm,Lo,M}; they
// overlap, which is what makes the backtracking below necessary.
func upperThenLower(s string, i int) int {
	j := i
	lowerEnd := -1 // end of the last Upper-run character that is also Lower
	for j < len(s) {
		c, n := classAt(s, j)
		if c&cUpper == 0 {
			break
		}
		j += n
		if c&cLower != 0 {
			lowerEnd = j
		}
	}
	k := runEnd(s, j, cLower)
	if k == j {
		// [Lower]+ found nothing after the greedy [Upper]*, so the engine
		// gives back Upper characters one at a time. The first point where
		// [Lower]+ can match is the last Upper character that is also Lower,
		// and [Lower]+ takes only that one character: everything after it
		// up to j is Upper-only, and s[j] is not Lower.
		if lowerEnd < 0 {
			return -1
		}
		k = lowerEnd
	}
	return contraction(s, k)
}

// upperRun matches [Upper]+[Lower]*(contraction)? at s[i:], returning the end
// or -1. Both runs are greedy and nothing after them can fail, so no
// backtracking is needed.
func upperRun(s string, i int) int {
	j := runEnd(s, i, cUpper)
	if j == i {
		return -1
	}
	return contraction(s, runEnd(s, j, cLower))
}

// runEnd is the end of the run at s[i:] of characters whose class has a
// bit of class: i when s[i] has none.
func runEnd(s string, i int, class uint8) int {
	for i < len(s) {
		c, n := classAt(s, i)
		if c&class == 0 {
			break
		}
		i += n
	}
	return i
}

// punctRun matches [^\s\p{L}\p{N}]+[\r\n/]* at s[i:], where s[i] is known to
// be in the first class.
func punctRun(s string, i int) int {
	j := i
	for j < len(s) {
		c, n := classAt(s, j)
		if c&notPunct != 0 {
			break
		}
		j += n
	}
	for j < len(s) && (s[j] == '\r' || s[j] == '\n' || s[j] == '/') {
		j++
	}
	return j
}

// contraction matches the optional (?i:'s|'t|'re|'ve|'m|'ll|'d) at s[k:] and
// returns the end of the match (k if absent). The reference compares
// unicode.ToLower of each input rune with the lower-case pattern; the only
// runes whose lower case is one of ' s t r e v m l d are those ASCII
// characters and their ASCII upper case (TestContractionFolding checks this
// against the unicode tables), so ASCII folding is exact.
func contraction(s string, k int) int {
	if k+1 >= len(s) || s[k] != '\'' {
		return k
	}
	switch s[k+1] | 0x20 {
	case 's', 't', 'm', 'd':
		return k + 2
	case 'r', 'v':
		if k+2 < len(s) && s[k+2]|0x20 == 'e' {
			return k + 3
		}
	case 'l':
		if k+2 < len(s) && s[k+2]|0x20 == 'l' {
			return k + 3
		}
	}
	return k
}
