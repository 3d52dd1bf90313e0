package textfacts

import (
	"strconv"
	"strings"

	"github.com/ctxpipe/ctxpipe/schema"
)

// The files-touched list as text: a summary's section and a truncation
// marker's line, both bounded, both complete, and both read back when a
// later condense summarizes the summary or the marker.
//
// Each entry of the list is one item:
//
//	src/app.py (edited)                     a file
//	django/db/models/{base.py,query.py} (read)  files of one directory
//	tests/** (read; 48 files)               every file the list held under tests/
//
// Paths hold no white space, braces or commas, so the forms cannot be
// confused. A list that fits its bound names every file on its own; past
// it, files of a directory that share an action share one item; past that,
// the deepest directories stand for the files under them, level by level,
// until the list fits. No file is left out: each is named, or lies under a
// directory that is.

// FilesTouchedHeading opens the list in a summary.
const FilesTouchedHeading = "## Files touched (listed mechanically from the tool calls)"

// MarkerFilesHeading opens the list on a truncation marker's line.
const MarkerFilesHeading = "Files the hidden messages touched:"

// RenderFilesTouched is the list as a summary section, "" when it is empty:
// one "- item" line per item, bounded in size.
func RenderFilesTouched(files []FileTouch) string {
	if len(files) == 0 {
		return ""
	}
	items := FileItems(files, MaxFileListChars, len("- \n"))
	var b strings.Builder
	b.WriteString(FilesTouchedHeading)
	for _, it := range items {
		b.WriteString("\n- ")
		b.WriteString(it)
	}
	return b.String()
}

// MarkerFiles is the list as a truncation marker's line, at most about
// budget bytes of items, "" when it is empty.
func MarkerFiles(files []FileTouch, budget int) string {
	if len(files) == 0 {
		return ""
	}
	return MarkerFilesHeading + " " + strings.Join(FileItems(files, budget, len(", ")), ", ")
}

// WithFilesTouched appends the files-touched section of msgs to a summary.
func WithFilesTouched(text string, msgs []schema.Message) string {
	return WithFileList(text, FilesTouched(msgs))
}

// WithFileList appends the files-touched section of files to a summary.
func WithFileList(text string, files []FileTouch) string {
	if s := RenderFilesTouched(files); s != "" {
		return strings.TrimRight(text, "\n") + "\n\n" + s
	}
	return text
}

// FileItems renders files as the items of a list whose items, each with
// sep bytes of separator, take at most budget bytes: each entry on its own
// if they fit, else grouped by directory (see the top of this file). Only
// when even the roots (./**, /**, ~/**) exceed budget is the result
// longer.
func FileItems(files []FileTouch, budget, sep int) []string {
	size := 0
	for _, f := range files {
		size += len(item(f)) + sep
	}
	if size <= budget {
		items := make([]string, len(files))
		for i, f := range files {
			items[i] = item(f)
		}
		return items
	}
	if items := braced(files); fits(items, budget, sep) {
		return items
	}
	deepest := 0
	for _, f := range files {
		deepest = max(deepest, depth(f))
	}
	for d := deepest - 1; d >= 0; d-- {
		if items := braced(fold(files, d)); fits(items, budget, sep) {
			return items
		}
	}
	return braced(fold(files, -1))
}

// item renders one entry on its own.
func item(f FileTouch) string {
	if f.Files == 0 {
		return f.Path + " (" + f.How + ")"
	}
	unit := " files)"
	if f.Files == 1 {
		unit = " file)"
	}
	return f.Path + "** (" + f.How + "; " + strconv.Itoa(f.Files) + unit
}

func fits(items []string, budget, sep int) bool {
	n := 0
	for _, it := range items {
		n += len(it) + sep
	}
	return n <= budget
}

// braced renders files with the files of one directory that share an
// action in one item, dir/{a,b} (how), placed where the first of them was.
// Groups and directories listed as such stay on their own.
func braced(files []FileTouch) []string {
	type key struct{ dir, how string }
	var (
		items   []string
		members [][]string // per item: the base names braced into it
		at      = map[key]int{}
	)
	for _, f := range files {
		i := strings.LastIndexByte(f.Path, '/')
		if f.Files > 0 || i < 0 || i == len(f.Path)-1 {
			items, members = append(items, item(f)), append(members, nil)
			continue
		}
		k := key{f.Path[:i+1], f.How}
		if j, ok := at[k]; ok {
			members[j] = append(members[j], f.Path[i+1:])
			continue
		}
		at[k] = len(items)
		items, members = append(items, item(f)), append(members, []string{f.Path[i+1:]})
	}
	for k, j := range at {
		if len(members[j]) > 1 {
			items[j] = k.dir + "{" + strings.Join(members[j], ",") + "} (" + k.how + ")"
		}
	}
	return items
}

// depth is how many directories deep an entry lies: a file's parent
// directories, a group's own. The working directory's group is 0 deep.
func depth(f FileTouch) int {
	if f.Files > 0 {
		if f.Path == "./" {
			return 0
		}
		return strings.Count(f.Path, "/")
	}
	return strings.Count(strings.TrimSuffix(f.Path, "/"), "/")
}

// rootDepth is how deep the shallowest group of path may be: the root of
// an absolute path is / and that of a home path ~/, one level down; that
// of a relative path is the working directory's tree.
func rootDepth(path string) int {
	if strings.HasPrefix(path, "/") || strings.HasPrefix(path, "~/") {
		return 1
	}
	return 0
}

// fold turns every entry deeper than d into the group of its directory at
// depth d (or its root's, when d is shallower, or when d is -1), keeping
// the order in which each item first appears.
func fold(files []FileTouch, d int) []FileTouch {
	var t Touched
	for _, f := range files {
		at := max(d, rootDepth(f.Path))
		if d < 0 {
			at = rootDepth(f.Path)
		}
		if depth(f) <= at && !(d < 0 && f.Files == 0) {
			t.addEntry(f)
			continue
		}
		t.addEntry(FileTouch{Path: ancestor(f.Path, at), How: f.How, Files: max(f.Files, 1)})
	}
	return t.out
}

// ancestor is the directory of path at depth d (d ≥ rootDepth(path)): the
// prefix of path through its d-th slash, or ./ for depth 0.
func ancestor(path string, d int) string {
	if d == 0 {
		return "./"
	}
	i := -1
	for range d {
		k := strings.IndexByte(path[i+1:], '/')
		if k < 0 {
			break
		}
		i += k + 1
	}
	return path[:i+1]
}

// fileItem reads one item of a list back: the files it names (a braced
// item names several), or a group. ok is false for text that is no item.
func fileItem(s string) (files []FileTouch, ok bool) {
	rest, ok := strings.CutSuffix(s, ")")
	if !ok {
		return nil, false
	}
	// The parenthesis holds no " (", so the last one opens it.
	i := strings.LastIndex(rest, " (")
	if i < 0 {
		return nil, false
	}
	p, inner := rest[:i], rest[i+2:]
	if p == "" || strings.ContainsAny(p, " \t\n\f\r") {
		return nil, false
	}
	if how, count, grouped := strings.Cut(inner, "; "); grouped {
		n := strings.TrimSuffix(strings.TrimSuffix(count, " files"), " file")
		k, err := strconv.Atoi(n)
		dir, isGroup := strings.CutSuffix(p, "**")
		if !isAction(how) || err != nil || k < 1 || n != strconv.Itoa(k) || !isGroup || !strings.HasSuffix(dir, "/") {
			return nil, false
		}
		return []FileTouch{{Path: dir, How: how, Files: k}}, true
	}
	if !isAction(inner) {
		return nil, false
	}
	if open := strings.LastIndexByte(p, '{'); open > 0 && p[open-1] == '/' && strings.HasSuffix(p, "}") {
		names := strings.Split(p[open+1:len(p)-1], ",")
		valid := len(names) > 1
		for _, n := range names {
			valid = valid && n != "" && !strings.ContainsAny(n, "{}")
		}
		if valid {
			for _, n := range names {
				files = append(files, FileTouch{Path: p[:open] + n, How: inner})
			}
			return files, true
		}
	}
	return []FileTouch{{Path: p, How: inner}}, true
}

func isAction(how string) bool { return how == "created" || how == "edited" || how == "read" }

// filesFromList reads back the files-touched lists in text, in order: the
// last section of a summary (an earlier one may be quoted above it) and
// every marker line, so a later condense carries their files forward.
func filesFromList(text string) []FileTouch {
	var out []FileTouch
	section := lastLineStart(text, FilesTouchedHeading)
	for at := 0; at < len(text); {
		line, _, _ := strings.Cut(text[at:], "\n")
		start := at
		at += len(line) + 1
		if start == section {
			out = append(out, sectionFiles(text[start+len(FilesTouchedHeading):])...)
		}
		if rest, ok := strings.CutPrefix(line, MarkerFilesHeading); ok {
			for it := range strings.SplitSeq(strings.TrimSpace(rest), ", ") {
				if fs, ok := fileItem(it); ok {
					out = append(out, fs...)
				}
			}
		}
	}
	return out
}

// sectionFiles reads the "- item" lines of a summary's section, up to the
// next heading.
func sectionFiles(section string) []FileTouch {
	var out []FileTouch
	for line := range strings.SplitSeq(section, "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "## ") {
			break
		}
		if rest, ok := strings.CutPrefix(line, "- "); ok {
			if fs, ok := fileItem(rest); ok {
				out = append(out, fs...)
			}
		}
	}
	return out
}

// lastLineStart is the index of the last occurrence of s in text that
// starts a line, or -1.
func lastLineStart(text, s string) int {
	for end := len(text); ; {
		i := strings.LastIndex(text[:end], s)
		if i <= 0 || text[i-1] == '\n' {
			return i
		}
		end = i + len(s) - 1
	}
}

// ListedFiles reads every files-touched list in text (a summary's section,
// a marker's line), groups included, as a later condense carries them.
func ListedFiles(text string) []FileTouch { return filesFromList(text) }

// Covers reports whether the list entry f names path or, as a group,
// stands for it: path lies under the group's directory (./ holds every
// relative path).
func (f FileTouch) Covers(path string) bool {
	if f.Files == 0 {
		return f.Path == path
	}
	if f.Path == "./" {
		return !strings.HasPrefix(path, "/") && !strings.HasPrefix(path, "~/")
	}
	return strings.HasPrefix(path, f.Path)
}
