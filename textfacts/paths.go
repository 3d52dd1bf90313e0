package textfacts

import (
	"path"
	"strconv"
	"strings"
)

// cleanPath normalizes a candidate path, returning "" when it is not one.
// A pytest node id (tests/test_a.py::TestX::test_y) names its file.
func cleanPath(w string) string {
	if i := strings.Index(w, "::"); i > 0 {
		w = w[:i]
	}
	w = strings.TrimSpace(w)
	w = strings.TrimRight(w, ".:")
	w = trimLineSuffix(w)
	w = strings.TrimPrefix(w, "./")
	if !LooksLikePath(w) {
		return ""
	}
	return w
}

// trimLineSuffix removes a trailing :line[:col…][:] as in a.go:12:3:, the
// regexp (:\d+)+:?$ written out.
func trimLineSuffix(w string) string {
	t := strings.TrimSuffix(w, ":")
	cut := -1
	for end := len(t); ; {
		k := end
		for k > 0 && t[k-1] >= '0' && t[k-1] <= '9' {
			k--
		}
		if k == end || k == 0 || t[k-1] != ':' {
			break
		}
		end = k - 1
		cut = end
	}
	if cut < 0 {
		return w
	}
	return w[:cut]
}

// ExplicitPath accepts the value of a key that names a file or directory,
// which needs no extension or slash to count as one.
func ExplicitPath(p string) string {
	p = strings.TrimPrefix(strings.TrimSpace(p), "./")
	if p == "" || p == "." || len(p) > 200 || strings.HasPrefix(p, "-") || !onlyPathChars(p) {
		return ""
	}
	return p
}

// pathChars marks the bytes a path may hold: [A-Za-z0-9_./~+@-].
var pathChars = byteSet("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./~+@-")

// onlyPathChars reports whether w is one or more path bytes.
func onlyPathChars(w string) bool {
	for i := 0; i < len(w); i++ {
		if !pathChars[w[i]] {
			return false
		}
	}
	return w != ""
}

// isSedScript reports whether w is a sed expression such as s/old/new/g or
// y/abc/xyz/: the regexp ^[sy]/[^/]*/[^/]*/[a-zA-Z0-9]*$ written out.
func isSedScript(w string) bool {
	if len(w) < 2 || w[0] != 's' && w[0] != 'y' || w[1] != '/' {
		return false
	}
	rest := w[2:]
	for range 2 {
		i := strings.IndexByte(rest, '/')
		if i < 0 {
			return false
		}
		rest = rest[i+1:]
	}
	for i := 0; i < len(rest); i++ {
		if c := rest[i]; !isLetter(rune(c)) && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// KnownExt reports whether ext (without its dot) is a file extension that
// makes a bare name (no slash) count as a file.
func KnownExt(ext string) bool { return fileExts[ext] }

// Extensions that make a bare name (no slash) count as a file.
var fileExts = map[string]bool{
	"py": true, "pyi": true, "go": true, "js": true, "mjs": true, "ts": true, "tsx": true, "jsx": true,
	"rs": true, "c": true, "h": true, "cc": true, "cpp": true, "hpp": true, "java": true, "kt": true,
	"rb": true, "php": true, "cs": true, "swift": true, "scala": true, "sh": true, "bash": true,
	"md": true, "rst": true, "txt": true, "json": true, "jsonl": true, "yaml": true, "yml": true,
	"toml": true, "cfg": true, "ini": true, "conf": true, "sql": true, "html": true, "css": true,
	"xml": true, "lock": true, "mod": true, "sum": true, "proto": true, "patch": true, "diff": true,
	"log": true, "csv": true, "ipynb": true, "vue": true, "svelte": true,
}

// LooksLikePath accepts words such as src/x.py, /testbed/pkg/, ./a/b and
// setup.cfg, and rejects flags, URLs, numbers, device files and dotted
// identifiers such as os.path.
func LooksLikePath(w string) bool {
	if len(w) < 2 || len(w) > 200 || strings.HasPrefix(w, "-") || strings.Contains(w, "://") ||
		!onlyPathChars(w) {
		return false
	}
	for _, skip := range []string{"/dev/", "/proc/", "/sys/"} {
		if strings.HasPrefix(w, skip) || w == skip[:len(skip)-1] {
			return false
		}
	}
	if w == ".." || w == "~" || strings.Trim(w, "./") == "" {
		return false
	}
	if isSedScript(w) {
		return false // s/old/new/g is a sed expression, not a directory
	}
	if ext := strings.TrimPrefix(path.Ext(w), "."); fileExts[ext] {
		base := strings.TrimSuffix(path.Base(w), "."+ext)
		return base != "" && !isNumber(base)
	}
	return dirPath(w)
}

// dirPath tells whether w, a word with no known file extension, names a
// path: it has a slash, and it is absolute, home- or parent-relative with a
// letter in it, or relative with every segment starting like a name (so
// that arithmetic such as x/2 is not taken for a path).
func dirPath(w string) bool {
	if !strings.Contains(w, "/") {
		return false
	}
	if strings.HasPrefix(w, "/") || strings.HasPrefix(w, "~/") || strings.HasPrefix(w, "../") {
		return strings.IndexFunc(w, isLetter) >= 0
	}
	for _, seg := range strings.Split(strings.TrimSuffix(w, "/"), "/") {
		if seg == "" || !(isLetter(rune(seg[0])) || seg[0] == '_' || seg[0] == '.') {
			return false
		}
	}
	return true
}

func isLetter(r rune) bool { return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' }

// isNumber reports whether strconv.ParseFloat accepts s. A float starts,
// after its sign, with a digit, a dot, or the i or n of inf and nan; any
// other start is answered at once, which spares ParseFloat the error it
// would allocate for each ordinary file name.
func isNumber(s string) bool {
	t := s
	if t != "" && (t[0] == '+' || t[0] == '-') {
		t = t[1:]
	}
	if t == "" {
		return false
	}
	switch t[0] {
	case '0', '1', '2', '3', '4', '5', '6', '7', '8', '9', '.', 'i', 'I', 'n', 'N':
		_, err := strconv.ParseFloat(s, 64)
		return err == nil
	}
	return false
}
