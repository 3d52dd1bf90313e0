package textfacts

import (
	"iter"
	"regexp"
	"strings"
	"unicode/utf8"
)

// Error lines. A tool's output reports an error on a line that names one
// (Error, Exception, FAILED, Traceback…) and is not source code that merely
// mentions one (an "except ValueError:" in a listing the agent read).
var (
	codeLinePattern  = regexp.MustCompile(`^(?:[\w./-]+:\d+:\s*|\d+[:\s]\s*|[+-]\s*)?(?:raise|except|class|def|return|import|from|if|elif|else|assert|try|with|for|while|yield|lambda|await|self\.|#|//|/\*|\*|"|')`)
	boilerplateLines = map[string]bool{
		"Traceback (most recent call last):":                                   true,
		"During handling of the above exception, another exception occurred:":  true,
		"The above exception was the direct cause of the following exception:": true,
	}
)

// MaxErrorLineChars bounds a last error line, which summaries, stand-ins
// and truncation markers quote verbatim.
const MaxErrorLineChars = 1000

// LastErrorLine is the last line of a tool's output that reports an error,
// white space collapsed, or "" when none does. A masked stand-in gives the
// error line it kept.
func LastErrorLine(out string) string {
	if l, ok := standInError(out); ok {
		return l
	}
	if !mayReportError(out) {
		return "" // no line can report one: skip the walk over the lines
	}
	// From the last line back, without splitting the whole output: tool
	// outputs run to megabytes and the error is usually near the end.
	for line := range linesBackward(out) {
		if !mayReportError(line) || !reportsError(line) {
			continue
		}
		l := CollapseSpace(line)
		if l == "" || boilerplateLines[l] || codeLinePattern.MatchString(l) {
			continue
		}
		return Clip(l, MaxErrorLineChars)
	}
	return ""
}

// linesBackward yields s's lines from the last to the first, without
// splitting s: a trailing newline yields no empty last line.
func linesBackward(s string) iter.Seq[string] {
	return func(yield func(string) bool) {
		for rest := s; rest != ""; {
			line := rest
			if i := strings.LastIndexByte(rest, '\n'); i >= 0 {
				line, rest = rest[i+1:], rest[:i]
			} else {
				rest = ""
			}
			if !yield(line) {
				return
			}
		}
	}
}

// mayReportError is a cheap superset of reportsError: most lines hold none
// of its words, and five substring tests beat its word-boundary checks.
func mayReportError(line string) bool {
	return strings.Contains(line, "rror") || strings.Contains(line, "RROR") || strings.Contains(line, "xception") ||
		strings.Contains(line, "Traceback") || strings.Contains(line, "FAILED")
}

// reportsError reports whether line names an error as the pattern
// (?:Error|Exception|exceptions?)\b|\berror\b|\bERROR\b|Traceback|FAILED
// matches it: a class name such as ValueError, or error as a word. It is
// written out because it runs on every line LastErrorLine reads.
func reportsError(line string) bool {
	return strings.Contains(line, "Traceback") || strings.Contains(line, "FAILED") ||
		hasWord(line, "Error", false) || hasWord(line, "Exception", false) ||
		hasWord(line, "exception", false) || hasWord(line, "exceptions", false) ||
		hasWord(line, "error", true) || hasWord(line, "ERROR", true)
}

// hasWord reports whether w occurs in s with a word boundary after it (w
// ends in a letter) and, when whole, one before it too.
func hasWord(s, w string, whole bool) bool {
	for i := 0; ; {
		k := strings.Index(s[i:], w)
		if k < 0 {
			return false
		}
		k += i
		if e := k + len(w); (e == len(s) || !isWordByte(s[e])) && (!whole || k == 0 || !isWordByte(s[k-1])) {
			return true
		}
		i = k + 1
	}
}

// findReturnCode finds the leftmost <returncode>\s*(-?\d+)\s*</returncode>
// in s: the code, the whole element, and whether there is one. It is
// written out because it runs on every failed tool result.
func findReturnCode(s string) (code, elem string, ok bool) {
	const open, closing = "<returncode>", "</returncode>"
	for from := 0; ; {
		i := strings.Index(s[from:], open)
		if i < 0 {
			return "", "", false
		}
		i += from
		from = i + 1
		j := skipSpace(s, i+len(open))
		start := j
		if j < len(s) && s[j] == '-' {
			j++
		}
		d := j
		for j < len(s) && s[j] >= '0' && s[j] <= '9' {
			j++
		}
		if j == d {
			continue
		}
		end := skipSpace(s, j)
		if strings.HasPrefix(s[end:], closing) {
			return s[start:j], s[i : end+len(closing)], true
		}
	}
}

// FailureLine is what the output of a failed tool call says, in one line:
// for a masked stand-in, the error line it kept ("(output masked)" when it
// kept none); else the code of a <returncode> element near its start
// ("exit 2: ") followed by its first meaningful line, or by the last one
// when the first opens a Python traceback, which names the exception ("(no
// output)" when no line is meaningful).
func FailureLine(body string) string {
	if strings.HasPrefix(body, MaskPrefix) {
		if l := LastErrorLine(body); l != "" {
			return l
		}
		return "(output masked)"
	}
	prefix := ""
	if code, elem, ok := findReturnCode(Head(body, 256)); ok {
		prefix = "exit " + code + ": "
		body = strings.Replace(body, elem, "", 1)
	}
	first := "(no output)"
	if lines := meaningfulLines(Head(body, 8<<10)); len(lines) > 0 {
		first = lines[0]
		// A Python traceback's first line says nothing; its last names the exception.
		if strings.HasPrefix(first, "Traceback (most recent call last)") {
			if end := meaningfulLines(tail(body, 8<<10)); len(end) > 0 {
				first = end[len(end)-1]
			}
		}
	}
	return prefix + first
}

// meaningfulLines are the non-blank lines of s with XML-ish tags removed.
func meaningfulLines(s string) []string {
	var out []string
	for line := range strings.SplitSeq(s, "\n") {
		if l := strings.TrimSpace(stripTags(line)); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// maxTagRunes bounds what stripTags takes for a tag: <name attr="…">, not
// a comparison such as a < b > c across a line.
const maxTagRunes = 40

// stripTags removes what the regexp <[^<>\n]{1,40}> matches: a < and a >
// with 1 to 40 runes between them, none of them <, > or a newline. It
// allocates only when it removes something; most lines hold no tag.
func stripTags(line string) string {
	i := strings.IndexByte(line, '<')
	if i < 0 {
		return line
	}
	var b strings.Builder
	kept := 0 // line[kept:i] is not yet copied
	for i >= 0 {
		j, runes := i+1, 0
		for j < len(line) && line[j] != '<' && line[j] != '>' && line[j] != '\n' && runes <= maxTagRunes {
			_, size := utf8.DecodeRuneInString(line[j:]) // an invalid byte counts as one rune, as in regexp
			j += size
			runes++
		}
		next := i + 1
		if j < len(line) && line[j] == '>' && runes >= 1 && runes <= maxTagRunes {
			b.WriteString(line[kept:i])
			kept, next = j+1, j+1
		}
		if k := strings.IndexByte(line[next:], '<'); k >= 0 {
			i = next + k
		} else {
			i = -1
		}
	}
	if kept == 0 {
		return line
	}
	b.WriteString(line[kept:])
	return b.String()
}
