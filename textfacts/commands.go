package textfacts

import (
	"strings"
	"unicode/utf8"

	"github.com/ctxpipe/ctxpipe/schema"
)

// commandLines walks the lines of a shell command that the shell reads as
// commands. The body of a here document (the lines after the line that
// opens it with <<WORD or <<-WORD, up to its closing line WORD) is the
// contents of a file, not commands: it is skipped, and the lines after the
// closing line are read again. A body that never closes runs to the end.
type commandLines struct {
	rest string
	done bool
}

// next is the next command line, and false after the last.
func (c *commandLines) next() (string, bool) {
	if c.done {
		return "", false
	}
	line, more, found := strings.Cut(c.rest, "\n")
	if !found {
		c.done = true
		return line, true
	}
	c.rest = more
	if strings.Contains(line, "<<") {
		var closed bool
		c.rest, closed = skipHereDocs(line, c.rest)
		c.done = !closed
	}
	return line, true
}

// skipHereDocs skips, in rest (the text after line), the bodies of the here
// documents line opens, in order, each up to its closing line. closed is
// false when no line follows the last body.
func skipHereDocs(line, rest string) (after string, closed bool) {
	for i := 0; ; {
		delim, strip, end, ok := nextHereDoc(line, i)
		if end < 0 {
			return rest, true
		}
		i = end
		if !ok {
			continue
		}
		for {
			l, more, found := strings.Cut(rest, "\n")
			if strip {
				l = strings.TrimLeft(l, "\t")
			}
			if !found {
				return "", false // closed on the last line or not at all: nothing follows
			}
			rest = more
			if l == delim {
				break
			}
		}
	}
}

// nextHereDoc finds the first << at or after line[i:] and reads the here
// document it opens: the pattern <<(-?)[ \t]*(WORD)? where WORD is made of
// '…', "…", a backslash and the character after it, and characters other
// than white space, quotes, backslashes and ;|&<>(). end is the index past
// the match, -1 when there is no <<. ok is false when the match opens no
// here document: no word follows, or a < stands right before or after the
// << (a here-string <<<, or a run of them). delim is the word without its
// quotes and backslashes, as the closing line spells it; strip reports
// <<-, whose closing line may be indented with tabs.
func nextHereDoc(line string, i int) (delim string, strip bool, end int, ok bool) {
	k := strings.Index(line[i:], "<<")
	if k < 0 {
		return "", false, -1, false
	}
	k += i
	j := k + 2
	if j < len(line) && line[j] == '-' {
		strip = true
		j++
	}
	for j < len(line) && (line[j] == ' ' || line[j] == '\t') {
		j++
	}
	var b strings.Builder
	start := j
	for j < len(line) {
		c := line[j]
		if c == '\'' || c == '"' {
			e := strings.IndexByte(line[j+1:], c)
			if e < 0 {
				break // an unclosed quote ends the word before it
			}
			b.WriteString(line[j+1 : j+1+e])
			j += e + 2
			continue
		}
		if c == '\\' {
			if j+1 == len(line) || line[j+1] == '\n' {
				break
			}
			_, size := utf8.DecodeRuneInString(line[j+1:])
			b.WriteString(line[j+1 : j+1+size])
			j += 1 + size
			continue
		}
		if endsHereWord[c] {
			break
		}
		b.WriteByte(c)
		j++
	}
	ok = j > start && (k == 0 || line[k-1] != '<') && (k+2 == len(line) || line[k+2] != '<')
	return b.String(), strip, j, ok
}

// endsHereWord marks the bytes that end a here document's word outside
// quotes: the regexp class [\s;|&<>()].
var endsHereWord = byteSet(" \t\n\f\r;|&<>()")

// It stands for the pattern
//
//	(?:>>?|\btee\s+(?:-a\s+)?)\s*['"]?([^\s'";|&<>()]+)
//
// matched leftmost-first and without overlap, written out by hand because
// it runs over every command line of every condensed span.
func writeTargets(line string, out []string) []string {
	for i := 0; i < len(line); {
		var j int // just past the operator
		switch {
		case line[i] == '>':
			j = i + 1
			if j < len(line) && line[j] == '>' {
				j++
			}
		case line[i] == 't' && strings.HasPrefix(line[i+1:], "ee") && (i == 0 || !isWordByte(line[i-1])):
			j = skipSpace(line, i+3)
			if j == i+3 {
				i++ // tee must be followed by white space
				continue
			}
			// -a and its white space belong to the operator only if a
			// target follows them; else "-a" itself is the target word.
			if strings.HasPrefix(line[j:], "-a") {
				if k := skipSpace(line, j+2); k > j+2 {
					if w, end := writeTarget(line, k); end > 0 {
						out = append(out, w)
						i = end
						continue
					}
				}
			}
		default:
			i++
			continue
		}
		if w, end := writeTarget(line, j); end > 0 {
			out = append(out, w)
			i = end
			continue
		}
		i++
	}
	return out
}

// writeTarget reads \s*['"]?([^\s'";|&<>()]+) at line[j:]: the word and
// the index just past it, or end 0 when no word follows. No backtracking is
// needed: neither white space nor a quote can start the word.
func writeTarget(line string, j int) (word string, end int) {
	j = skipSpace(line, j)
	if j < len(line) && (line[j] == '\'' || line[j] == '"') {
		j++
	}
	e := j
	for e < len(line) && !endsTarget[line[e]] {
		e++
	}
	if e == j {
		return "", 0
	}
	return line[j:e], e
}

// endsTarget marks the bytes a write target cannot hold.
var endsTarget = byteSet(" \t\n\f\r'\";|&<>()")

// editsInPlace reports whether cmd runs sed -i (or --in-place), which edits
// the files it names: the pattern \bsed\s+(?:-[a-zA-Z]*i|--in-place),
// scanned by hand because the regexp backtracks at every byte of long
// heredoc commands.
func editsInPlace(cmd string) bool {
	for i := 0; ; {
		k := strings.Index(cmd[i:], "sed")
		if k < 0 {
			return false
		}
		k += i
		i = k + 1
		if k > 0 && isWordByte(cmd[k-1]) {
			continue
		}
		j := skipSpace(cmd, k+3)
		if j == k+3 || j == len(cmd) || cmd[j] != '-' {
			continue
		}
		if strings.HasPrefix(cmd[j:], "--in-place") {
			return true
		}
		// -[a-zA-Z]*i: some letter of the flag cluster is an i.
		for e := j + 1; e < len(cmd) && isLetter(rune(cmd[e])); e++ {
			if cmd[e] == 'i' {
				return true
			}
		}
	}
}

// isWordByte is the regexp \w for one byte: \b at a byte boundary of UTF-8

// maxCommandChars bounds the line that names a call in a list of commands.
const maxCommandChars = 140

// CallLine is what a tool call ran, as one line of a list of commands run:
// the first line of its command (the strings under its first command key
// that holds any, joined by spaces), marked when more lines follow; for a
// call with no command, its name and its raw input. paths are the paths
// the command's words name (nil without a command).
func CallLine(b schema.Block, in ToolInput) (line string, paths []string) {
	if len(in.Commands) > 0 {
		first := in.Commands[0]
		n := 1
		for n < len(in.Commands) && in.Commands[n].Key == first.Key {
			n++
		}
		cmd := first.Text
		paths = first.Paths
		if n > 1 {
			texts := make([]string, n)
			for i, c := range in.Commands[:n] {
				texts[i] = c.Text
			}
			cmd = strings.Join(texts, " ")
			paths = pathsInCommand(cmd)
		}
		line = commandLine(cmd)
	}
	if line == "" {
		name := b.Name
		if name == "" {
			name = "tool"
		}
		raw := CollapseSpace(string(b.Input))
		if raw == "" || raw == "{}" || raw == "null" {
			line = name
		} else {
			line = Clip(name+" "+raw, maxCommandChars)
		}
	}
	return line, paths
}

// commandLine is a command's first line, marked when more lines follow.
func commandLine(cmd string) string {
	cmd = strings.TrimSpace(cmd)
	first, rest, more := strings.Cut(cmd, "\n")
	first = CollapseSpace(first)
	if more && strings.TrimSpace(rest) != "" {
		first += " …"
	}
	return Clip(first, maxCommandChars)
}

// splitsWords marks the bytes that separate shell words: white space,
// quotes and operators, which is crude but enough to find path-like words.
// They are the regexp class [\s;|&<>()'"`=,{}\[\]$].
var splitsWords = byteSet(" \t\n\f\r;|&<>()'\"`=,{}[]$")

// pathsInCommand finds the words of a shell command that look like file
// paths, on its command lines (commandLines: here-document bodies are file
// contents, not paths). It scans bytes by hand: it runs on every command of
// every condensed span.
func pathsInCommand(cmd string) []string {
	var out []string
	for lines := (commandLines{rest: cmd}); ; {
		line, ok := lines.next()
		if !ok {
			break
		}
		for i := 0; i < len(line); {
			if splitsWords[line[i]] {
				i++
				continue
			}
			j := i + 1
			for j < len(line) && !splitsWords[line[j]] {
				j++
			}
			if p := cleanPath(line[i:j]); p != "" {
				out = append(out, p)
			}
			i = j
		}
	}
	return out
}
