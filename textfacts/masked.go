package textfacts

import (
	"regexp"
	"strings"
)

// A masked stand-in is the one line that replaces a tool result's body in
// the effective history (or in a summarizer's request):
//
//	[ctxpipe masked this tool result: WHAT; it reported an error; last error: LINE. Run the call again to see it.]
//
// WHAT names the call and the size hidden; the two notes are there only
// when they hold. The engine writes stand-ins, and the condensers and the
// truncation markers read the error line back, so the format lives here.

// MaskPrefix opens every stand-in, so a masked result is never masked again.
const MaskPrefix = "[ctxpipe masked this tool result: "

// maskSuffix closes every stand-in.
const maskSuffix = ". Run the call again to see it.]"

// StandIn is the stand-in for a tool output body: what names the call and
// the size hidden; isError adds that the call reported an error, and the
// last error line of body (LastErrorLine) is quoted when it has one, so the
// facts an agent acts on outlive the body.
func StandIn(what string, isError bool, body string) string {
	var b strings.Builder
	b.WriteString(MaskPrefix)
	b.WriteString(what)
	if isError {
		b.WriteString("; it reported an error")
	}
	if last := LastErrorLine(body); last != "" {
		b.WriteString("; last error: ")
		b.WriteString(last)
	}
	b.WriteString(maskSuffix)
	return b.String()
}

var (
	// standInSize reads a stand-in back: its line count, and what follows
	// the size (the error notes).
	standInSize = regexp.MustCompile(`; \d+ tokens, (\d+) lines hidden(.*)\. Run the call again to see it\.\]$`)
	// standInLastError is the last error line a stand-in quotes.
	standInLastError = regexp.MustCompile(`; last error: (.*)\. Run the call again to see it\.\]$`)
)

// ShortStandIn is the short form of a stand-in whose WHAT ends in "N tokens,
// L lines hidden": "L lines" and its error notes, for a summarizer's request,
// where the call sits right before its result and need not be named again.
// ok is false when s is no such stand-in.
func ShortStandIn(s string) (short string, ok bool) {
	if !strings.HasPrefix(s, MaskPrefix) {
		return "", false
	}
	m := standInSize.FindStringSubmatch(s)
	if m == nil {
		return "", false
	}
	return MaskPrefix + m[1] + " lines" + m[2] + maskSuffix, true
}

// standInError is the last error line a stand-in quotes, read from out
// (white space around it allowed); ok is false when out is no stand-in or
// quotes none.
func standInError(out string) (line string, ok bool) {
	t := strings.TrimSpace(out)
	if !strings.HasPrefix(t, MaskPrefix) {
		return "", false
	}
	if m := standInLastError.FindStringSubmatch(t); m != nil {
		return m[1], true
	}
	return "", false
}
