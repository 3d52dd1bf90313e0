package textfacts

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// isWordByte is the regexp \w for one byte: \b at a byte boundary of UTF-8
// text, where a byte of a multi-byte rune is never a word character.
func isWordByte(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_'
}

// isSpaceByte is the regexp \s: ASCII white space without \v.
func isSpaceByte(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\f' || c == '\r'
}

// skipSpace is the index of the first byte at or after i that is not \s.
func skipSpace(s string, i int) int {
	for i < len(s) && isSpaceByte(s[i]) {
		i++
	}
	return i
}

// byteSet marks the bytes of chars, for scanners that test a byte per step.
func byteSet(chars string) (set [256]bool) {
	for i := 0; i < len(chars); i++ {
		set[chars[i]] = true
	}
	return set
}

func containsAny(s string, parts []string) bool {
	for _, p := range parts {
		if strings.Contains(s, p) {
			return true
		}
	}
	return false
}

// CollapseSpace is strings.Join(strings.Fields(s), " "): white space runs
// become one space, none at the ends. Text that is already so (most
// commands and error lines) comes back as it is, with no allocation, and
// the rest is built in one buffer instead of a slice of fields and a join.
func CollapseSpace(s string) string {
	if isCollapsed(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for f := range strings.FieldsSeq(s) {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(f)
	}
	return b.String()
}

// isCollapsed reports whether CollapseSpace(s) is s: no white space but
// single spaces between non-space runes.
func isCollapsed(s string) bool {
	prevSpace := true // a leading space is not collapsed
	for _, r := range s {
		switch {
		case r == ' ':
			if prevSpace {
				return false
			}
			prevSpace = true
		case unicode.IsSpace(r):
			return false
		default:
			prevSpace = false
		}
	}
	return !prevSpace || s == ""
}

// Clip shortens s to at most n runes, marking a cut with "…".
func Clip(s string, n int) string {
	if n <= 0 {
		return ""
	}
	if len(s) <= n { // at most n bytes, so at most n runes
		return s
	}
	count := 0
	for i := range s {
		if count == n-1 {
			if utf8.RuneCountInString(s[i:]) <= 1 {
				return s
			}
			return s[:i] + "…"
		}
		count++
	}
	return s
}

// Head is at most the first n bytes of s, cut at a rune boundary.
func Head(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// tail is at most the last n bytes of s, cut at a rune boundary.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := len(s) - n
	for i < len(s) && !utf8.RuneStart(s[i]) {
		i++
	}
	return s[i:]
}
