package quality

import (
	"encoding/json"
	"strings"
)

// Files a tool call names: the measure behind "files kept". It is written
// apart from textfacts' extraction on purpose, from the shell's own rules, so
// that the table can catch that extraction missing a file.

// commandKeys are tool-input keys whose value is a shell command: a string,
// or an array of argv words.
var commandKeys = []string{"command", "cmd", "script"}

// FilesInInput is what a tool call names as the files it reads, edits,
// creates or runs:
//   - every value under a path key (pathKeys), as it is;
//   - the words of its shell commands that are paths (see shellPath), as
//     the shell splits them: quotes join a word, and here-document bodies
//     are left out, since they are the contents of a file, not files.
//
// Other strings of the input (a file's new content, a search pattern, an
// old and a new text) name no file the call touches.
func FilesInInput(raw json.RawMessage) []string {
	var in map[string]any
	if json.Unmarshal(raw, &in) != nil {
		return nil
	}
	var out []string
	for k, v := range in {
		if !pathKeys[strings.ToLower(k)] {
			continue
		}
		for _, s := range strings_(v) {
			if p := explicitPath(s); p != "" {
				out = append(out, p)
			}
		}
	}
	for _, k := range commandKeys {
		switch v := in[k].(type) {
		case string:
			for _, w := range ShellWords(v) {
				out = append(out, shellPath(w)...)
			}
		case []any:
			for _, e := range v {
				if w, ok := e.(string); ok {
					out = append(out, shellPath(w)...)
				}
			}
		}
	}
	return out
}

// strings_ is v's strings: v itself, or the strings of an array.
func strings_(v any) []string {
	switch t := v.(type) {
	case string:
		return []string{t}
	case []any:
		var out []string
		for _, e := range t {
			if s, ok := e.(string); ok {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}

// shellPath is the paths one shell word names: none when it holds white
// space (a quoted script or message), a glob or a backslash (a pattern), or
// is a sed expression; pseudo-files under /dev, /proc and /sys are not the
// agent's files. Otherwise what PathsInText finds in it, so --out=a/b.txt
// names a/b.txt, a.py:12 names a.py, and a pytest node id a.py::test_x
// its file.
func shellPath(w string) []string {
	if w == "" || strings.ContainsAny(w, " \t\n\r*?[]\\") || isSedExpression(w) {
		return nil
	}
	w, _, _ = strings.Cut(w, "::")
	var out []string
	for _, p := range PathsInText(w) {
		if !strings.HasPrefix(p, "/dev/") && !strings.HasPrefix(p, "/proc/") && !strings.HasPrefix(p, "/sys/") {
			out = append(out, p)
		}
	}
	return out
}

// isSedExpression reports whether w is a sed s or y command, such as
// s/a/b/g or s|a|b|: s or y, a delimiter, and two more of it.
func isSedExpression(w string) bool {
	if len(w) < 4 || w[0] != 's' && w[0] != 'y' {
		return false
	}
	d := w[1]
	if d != '/' && d != '|' && d != '#' && d != ',' && d != ':' {
		return false
	}
	return strings.Count(w[2:], string(d)) >= 2
}

// ShellWords splits a shell command into its words as the shell reads them:
// white space and the operators ; & | < > ( ) separate words, single quotes
// keep everything, double quotes and a backslash keep the next character,
// a # at the start of a word opens a comment. The body of each here
// document (<<WORD or <<-WORD, not the <<< of a here-string) is skipped up
// to its closing line. Operators are not returned.
func ShellWords(cmd string) []string {
	var (
		words   []string
		cur     strings.Builder
		inWord  bool
		pending []hereDoc // opened on this line, bodies start at the next
	)
	flush := func() {
		if inWord {
			words = append(words, cur.String())
		}
		cur.Reset()
		inWord = false
	}
	for i := 0; i < len(cmd); i++ {
		c := cmd[i]
		switch {
		case c == '\'':
			j := strings.IndexByte(cmd[i+1:], '\'')
			if j < 0 {
				j = len(cmd) - i - 1
			}
			cur.WriteString(cmd[i+1 : i+1+j])
			inWord = true
			i += j + 1
		case c == '"':
			inWord = true
			for i++; i < len(cmd) && cmd[i] != '"'; i++ {
				if cmd[i] == '\\' && i+1 < len(cmd) && strings.IndexByte("\"\\$`\n", cmd[i+1]) >= 0 {
					i++
				}
				cur.WriteByte(cmd[i])
			}
		case c == '\\':
			if i+1 < len(cmd) {
				i++
				if cmd[i] != '\n' { // a line continuation joins
					cur.WriteByte(cmd[i])
					inWord = true
				}
			}
		case c == '#' && !inWord:
			for i+1 < len(cmd) && cmd[i+1] != '\n' {
				i++
			}
		case c == '\n':
			flush()
			i = skipHereDocs(cmd, i+1, pending) - 1
			pending = pending[:0]
		case c == ' ' || c == '\t' || c == '\r':
			flush()
		case strings.HasPrefix(cmd[i:], "<<<"): // a here-string: its word is read
			flush()
			i += 2
		case strings.HasPrefix(cmd[i:], "<<"):
			flush()
			j := i + 2
			strip := j < len(cmd) && cmd[j] == '-'
			if strip {
				j++
			}
			for j < len(cmd) && (cmd[j] == ' ' || cmd[j] == '\t') {
				j++
			}
			delim, end := hereDelimiter(cmd, j)
			if delim != "" {
				pending = append(pending, hereDoc{delim: delim, strip: strip})
			}
			i = end - 1
		case strings.IndexByte(";&|<>()", c) >= 0:
			flush()
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	flush()
	return words
}

// hereDoc is a here document opened on the current line.
type hereDoc struct {
	delim string
	strip bool // <<-: leading tabs of the closing line are ignored
}

// hereDelimiter reads the delimiter word of a here document at cmd[j:]
// (quotes removed) and the index after it.
func hereDelimiter(cmd string, j int) (string, int) {
	var b strings.Builder
	for j < len(cmd) {
		c := cmd[j]
		switch {
		case c == '\'' || c == '"':
			k := strings.IndexByte(cmd[j+1:], c)
			if k < 0 {
				k = len(cmd) - j - 1
			}
			b.WriteString(cmd[j+1 : j+1+k])
			j += k + 2
			continue
		case c == ' ' || c == '\t' || c == '\n' || strings.IndexByte(";&|<>()", c) >= 0:
			return b.String(), j
		}
		b.WriteByte(c)
		j++
	}
	return b.String(), min(j, len(cmd))
}

// skipHereDocs skips, from the start of a line at i, the bodies of the
// here documents docs in order, each up to and including its closing line,
// and returns where the commands go on (len(cmd) when a body never ends).
func skipHereDocs(cmd string, i int, docs []hereDoc) int {
	for _, d := range docs {
		for i < len(cmd) {
			line, _, found := strings.Cut(cmd[i:], "\n")
			next := i + len(line) + 1
			if !found {
				next = len(cmd)
			}
			if d.strip {
				line = strings.TrimLeft(line, "\t")
			}
			i = next
			if line == d.delim {
				break
			}
		}
	}
	return i
}
