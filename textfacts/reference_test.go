package textfacts

import (
	"encoding/json"
	"path"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ctxpipe/ctxpipe/internal/transcripts"
	"github.com/ctxpipe/ctxpipe/prompts"
	"github.com/ctxpipe/ctxpipe/schema"
)

// The file, command and error extraction runs on every condense and
// truncation, so it scans by hand where regular expressions and a decode of
// each tool input into a map would do. Its output is part of every summary,
// so the scanners must not differ by one byte from those patterns: this
// file keeps them as the reference (the ref… names), and the tests below
// compare the two over every message of the shared real runs, plus seeds
// and a fuzz target for the inputs the runs lack. The reference follows
// every rule (here documents end at their closing line; lists are never
// cut, are read back from markers too, and group files), still written
// with regular expressions.

var (
	refRedirect     = regexp.MustCompile(`(?:>>?|\btee\s+(?:-a\s+)?)\s*['"]?([^\s'";|&<>()]+)`)
	refSedInPlace   = regexp.MustCompile(`\bsed\s+(?:-[a-zA-Z]*i|--in-place)`)
	refSplitCommand = regexp.MustCompile("[\\s;|&<>()'\"`=,{}\\[\\]$]+")
	refLineSuffix   = regexp.MustCompile(`(:\d+)+:?$`)
	refPathChars    = regexp.MustCompile(`^[A-Za-z0-9_./~+@-]+$`)
	refSedScript    = regexp.MustCompile(`^[sy]/[^/]*/[^/]*/[a-zA-Z0-9]*$`)
	refFileItem     = regexp.MustCompile(`^(\S+) \((created|edited|read)\)$`)
	refGroupItem    = regexp.MustCompile(`^(\S*/)\*\* \((created|edited|read); ([1-9][0-9]*) files?\)$`)
	refBraced       = regexp.MustCompile(`^(\S*/)\{([^{}]*)\}$`)
	refHereDoc      = regexp.MustCompile(`<<(-?)[ \t]*((?:'[^']*'|"[^"]*"|\\.|[^\s;|&<>()'"\\])*)`)
	refUnquote      = regexp.MustCompile(`'([^']*)'|"([^"]*)"|\\(.)`)
	refNodeID       = regexp.MustCompile(`^(.+?)::.*$`)
	refSectionStart = regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(FilesTouchedHeading))
	refReturnCode   = regexp.MustCompile(`<returncode>\s*(-?\d+)\s*</returncode>`)
	refTag          = regexp.MustCompile(`<[^<>\n]{1,40}>`)
	refErrorLine    = regexp.MustCompile(`(?:Error|Exception|exceptions?)\b|\berror\b|\bERROR\b|Traceback|FAILED`)
)

func refLastErrorLine(out string) string {
	if t := strings.TrimSpace(out); strings.HasPrefix(t, MaskPrefix) {
		if m := standInLastError.FindStringSubmatch(t); m != nil {
			return m[1]
		}
	}
	for line := range linesBackward(out) {
		if !mayReportError(line) || !refErrorLine.MatchString(line) {
			continue
		}
		l := strings.Join(strings.Fields(line), " ")
		if l == "" || boilerplateLines[l] || codeLinePattern.MatchString(l) {
			continue
		}
		return Clip(l, MaxErrorLineChars)
	}
	return ""
}

func refFilesTouched(msgs []schema.Message) []FileTouch {
	var out []FileTouch
	at := map[string]int{}
	rank := map[string]int{"read": 0, "edited": 1, "created": 2}
	addEntry := func(f FileTouch) {
		key := f.Path
		if f.Files > 0 {
			key += " group"
		}
		if f.Path == "" {
			return
		}
		if i, ok := at[key]; ok {
			if rank[f.How] > rank[out[i].How] {
				out[i].How = f.How
			}
			out[i].Files += f.Files
			return
		}
		at[key] = len(out)
		out = append(out, f)
	}
	add := func(p, how string) { addEntry(FileTouch{Path: p, How: how}) }
	for i, m := range msgs {
		if i == len(msgs)-1 && m.Role == schema.RoleUser && prompts.IsFinalInstruction(userText(m.Content)) {
			break
		}
		if m.IsCondenseSummary() {
			for _, f := range refFilesFromList(summaryText(m.Content)) {
				addEntry(f)
			}
			continue
		}
		if m.IsTruncationMarker {
			for _, f := range refFilesFromList(userText(m.Content)) {
				addEntry(f)
			}
		}
		for _, b := range m.Content.BlocksOf() {
			if b.Type == schema.BlockToolUse {
				refTouchedBy(b, add)
			}
		}
	}
	return out
}

func refTouchedBy(b schema.Block, add func(path, how string)) {
	how := touchOf(b.Name)
	var input map[string]any
	_ = json.Unmarshal(b.Input, &input)
	for _, k := range pathKeys {
		for _, p := range stringsOf(input[k]) {
			add(refExplicitPath(p), how)
		}
	}
	for _, k := range commandKeys {
		for _, cmd := range stringsOf(input[k]) {
			written := map[string]string{}
			for _, line := range refCommandLines(cmd) {
				for _, m := range refRedirect.FindAllStringSubmatch(line, -1) {
					if p := refCleanPath(m[1]); p != "" {
						written[p] = "created"
					}
				}
			}
			edits := refSedInPlace.MatchString(cmd)
			for _, p := range refPathsInCommand(cmd) {
				switch {
				case written[p] != "":
					add(p, written[p])
				case edits:
					add(p, "edited")
				default:
					add(p, "read")
				}
			}
		}
	}
}

// refFilesFromList reads the last summary section and every marker line
// of text, in order.
func refFilesFromList(text string) []FileTouch {
	var out []FileTouch
	section := -1
	for _, m := range refSectionStart.FindAllStringIndex(text, -1) {
		section = m[0]
	}
	for at := 0; at < len(text); {
		line, _, _ := strings.Cut(text[at:], "\n")
		if at == section {
			for _, l := range strings.Split(text[at+len(FilesTouchedHeading):], "\n") {
				l = strings.TrimSpace(l)
				if strings.HasPrefix(l, "## ") {
					break
				}
				if strings.HasPrefix(l, "- ") {
					out = append(out, refItem(l[2:])...)
				}
			}
		}
		if strings.HasPrefix(line, MarkerFilesHeading) {
			for _, it := range strings.Split(strings.TrimSpace(line[len(MarkerFilesHeading):]), ", ") {
				out = append(out, refItem(it)...)
			}
		}
		at += len(line) + 1
	}
	return out
}

// refItem reads one list item: a group, a braced directory or a file.
func refItem(it string) []FileTouch {
	if m := refGroupItem.FindStringSubmatch(it); m != nil {
		n, _ := strconv.Atoi(m[3])
		return []FileTouch{{Path: m[1], How: m[2], Files: n}}
	}
	m := refFileItem.FindStringSubmatch(it)
	if m == nil {
		return nil
	}
	if b := refBraced.FindStringSubmatch(m[1]); b != nil {
		names := strings.Split(b[2], ",")
		if len(names) > 1 && !slices.Contains(names, "") {
			var out []FileTouch
			for _, n := range names {
				out = append(out, FileTouch{Path: b[1] + n, How: m[2]})
			}
			return out
		}
	}
	return []FileTouch{{Path: m[1], How: m[2]}}
}

// refCommandLines is the lines of cmd outside here-document bodies.
func refCommandLines(cmd string) []string {
	lines := strings.Split(cmd, "\n")
	var out []string
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		out = append(out, line)
		for _, m := range refHereDoc.FindAllStringSubmatchIndex(line, -1) {
			if m[4] == m[5] || m[0] > 0 && line[m[0]-1] == '<' || m[0]+2 < len(line) && line[m[0]+2] == '<' {
				continue
			}
			delim := refUnquote.ReplaceAllString(line[m[4]:m[5]], "$1$2$3")
			for i++; i < len(lines); i++ {
				l := lines[i]
				if m[3] > m[2] {
					l = strings.TrimLeft(l, "\t")
				}
				if l == delim {
					break
				}
			}
		}
	}
	return out
}

func refPathsInCommand(cmd string) []string {
	var out []string
	for _, line := range refCommandLines(cmd) {
		for _, w := range refSplitCommand.Split(line, -1) {
			if p := refCleanPath(w); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}

func refCleanPath(w string) string {
	w = refNodeID.ReplaceAllString(w, "$1")
	w = strings.TrimSpace(w)
	w = strings.TrimRight(w, ".:")
	w = refLineSuffix.ReplaceAllString(w, "")
	w = strings.TrimPrefix(w, "./")
	if !refLooksLikePath(w) {
		return ""
	}
	return w
}

func refExplicitPath(p string) string {
	p = strings.TrimPrefix(strings.TrimSpace(p), "./")
	if p == "" || p == "." || len(p) > 200 || strings.HasPrefix(p, "-") || !refPathChars.MatchString(p) {
		return ""
	}
	return p
}

func refLooksLikePath(w string) bool {
	if len(w) < 2 || len(w) > 200 || strings.HasPrefix(w, "-") || strings.Contains(w, "://") ||
		!refPathChars.MatchString(w) {
		return false
	}
	for _, skip := range []string{"/dev/", "/proc/", "/sys/"} {
		if strings.HasPrefix(w, skip) || w+"/" == skip {
			return false
		}
	}
	if w == ".." || w == "~" || strings.Trim(w, "./") == "" {
		return false
	}
	if refSedScript.MatchString(w) {
		return false
	}
	if ext := strings.TrimPrefix(path.Ext(w), "."); fileExts[ext] {
		base := strings.TrimSuffix(path.Base(w), "."+ext)
		_, err := strconv.ParseFloat(base, 64)
		return base != "" && err != nil
	}
	return dirPath(w)
}

func refMeaningfulLines(s string) []string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		if l := strings.TrimSpace(refTag.ReplaceAllString(line, "")); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// refWritten is what the reference found as shell write targets in one line.
func refWritten(line string) []string {
	var out []string
	for _, m := range refRedirect.FindAllStringSubmatch(line, -1) {
		out = append(out, m[1])
	}
	return out
}

// corpus is every string of the runs the extraction may be given: the
// inputs (each tool call's command and path values) and the outputs (each
// text block and each tool result's rendered output).
func corpus(runs []transcripts.Run) (inputs, outputs []string) {
	for _, r := range runs {
		for _, m := range r.Messages {
			for _, b := range m.Content.BlocksOf() {
				switch b.Type {
				case schema.BlockText:
					outputs = append(outputs, b.Text)
				case schema.BlockToolResult:
					if b.Content != nil {
						outputs = append(outputs, b.Content.OwnText("\n\n"))
					}
				case schema.BlockToolUse:
					var input map[string]any
					_ = json.Unmarshal(b.Input, &input)
					for _, k := range append(append([]string(nil), pathKeys...), commandKeys...) {
						inputs = append(inputs, stringsOf(input[k])...)
					}
				}
			}
		}
	}
	return inputs, outputs
}

// excerptHead is how much of a text the offline condenser collapses for an
// excerpt of an assistant note: 8 × its 180-character bound.
const excerptHead = 8 * 180

// transcriptDir is reached by a relative path so the tests run the same in
// the work tree and in CI, where shared/ sits beside the repository.
const transcriptDir = "../../shared/data/transcripts"

// sameOutputExtraction fails t where the scanners and the reference
// disagree on a tool output or a text, on the parts of it each reads. The
// command scanners are not run over outputs: through the regexps the 6.5 MB
// take minutes under the race detector, and the fuzz target covers them.
func sameOutputExtraction(t *testing.T, s string) {
	t.Helper()
	if got, want := LastErrorLine(s), refLastErrorLine(s); got != want {
		t.Fatalf("LastErrorLine(%q) = %q, reference %q", s, got, want)
	}
	if got, want := meaningfulLines(Head(s, 8<<10)), refMeaningfulLines(Head(s, 8<<10)); !reflect.DeepEqual(got, want) {
		t.Fatalf("meaningfulLines(%q) = %q, reference %q", Head(s, 8<<10), got, want)
	}
	gotCode, gotSpan, gotOK := findReturnCode(Head(s, 256))
	if m := refReturnCode.FindStringSubmatch(Head(s, 256)); gotOK != (m != nil) || gotOK && (gotCode != m[1] || gotSpan != m[0]) {
		t.Fatalf("findReturnCode(%q) = %q %q %v, reference %q", Head(s, 256), gotCode, gotSpan, gotOK, m)
	}
	if e := Head(s, excerptHead); CollapseSpace(e) != strings.Join(strings.Fields(e), " ") {
		t.Fatalf("CollapseSpace(%q) = %q", e, CollapseSpace(e))
	}
}

// sameExtraction fails t where the scanners and the reference disagree on
// s: as a command, as a path value, and line by line.
func sameExtraction(t *testing.T, s string) {
	t.Helper()
	if got, want := pathsInCommand(s), refPathsInCommand(s); !reflect.DeepEqual(got, want) {
		t.Fatalf("pathsInCommand(%q) = %q, reference %q", s, got, want)
	}
	if got, want := editsInPlace(s), refSedInPlace.MatchString(s); got != want {
		t.Fatalf("editsInPlace(%q) = %v, reference %v", s, got, want)
	}
	if got, want := meaningfulLines(Head(s, 8<<10)), refMeaningfulLines(Head(s, 8<<10)); !reflect.DeepEqual(got, want) {
		t.Fatalf("meaningfulLines(%q) = %q, reference %q", Head(s, 8<<10), got, want)
	}
	if got, want := LastErrorLine(s), refLastErrorLine(s); got != want {
		t.Fatalf("LastErrorLine(%q) = %q, reference %q", s, got, want)
	}
	if got, want := CollapseSpace(s), strings.Join(strings.Fields(s), " "); got != want {
		t.Fatalf("CollapseSpace(%q) = %q, reference %q", s, got, want)
	}
	gotCode, gotSpan, gotOK := findReturnCode(Head(s, 256))
	if m := refReturnCode.FindStringSubmatch(Head(s, 256)); gotOK != (m != nil) || gotOK && (gotCode != m[1] || gotSpan != m[0]) {
		t.Fatalf("findReturnCode(%q) = %q %q %v, reference %q", Head(s, 256), gotCode, gotSpan, gotOK, m)
	}
	for line := range strings.SplitSeq(s, "\n") {
		if got, want := reportsError(line), refErrorLine.MatchString(line); got != want {
			t.Fatalf("reportsError(%q) = %v, reference %v", line, got, want)
		}
		if got, want := writeTargets(line, nil), refWritten(line); !reflect.DeepEqual(got, want) {
			t.Fatalf("writeTargets(%q) = %q, reference %q", line, got, want)
		}
	}
	if got, want := ExplicitPath(s), refExplicitPath(s); got != want {
		t.Fatalf("ExplicitPath(%q) = %q, reference %q", s, got, want)
	}
}

// sameWords fails t where the word tests and the reference disagree on a
// word of s. The corpus test leaves them to pathsInCommand, which applies
// them to every word; the seeds and the fuzzer call them one by one.
func sameWords(t *testing.T, s string) {
	t.Helper()
	for line := range strings.SplitSeq(s, "\n") {
		for _, w := range refSplitCommand.Split(line, -1) {
			if got, want := cleanPath(w), refCleanPath(w); got != want {
				t.Fatalf("cleanPath(%q) = %q, reference %q", w, got, want)
			}
			if got, want := ExplicitPath(w), refExplicitPath(w); got != want {
				t.Fatalf("ExplicitPath(%q) = %q, reference %q", w, got, want)
			}
			if got, want := LooksLikePath(w), refLooksLikePath(w); got != want {
				t.Fatalf("looksLikePath(%q) = %v, reference %v", w, got, want)
			}
		}
	}
}

// refToolInput is what ReadToolInput read before the JSON fast path: every
// input through encoding/json.
func refToolInput(raw []byte) ToolInput {
	var in ToolInput
	var input map[string]any
	_ = json.Unmarshal(raw, &input)
	for _, k := range pathKeys {
		in.Paths = append(in.Paths, stringsOf(input[k])...)
	}
	for i, k := range commandKeys {
		for _, cmd := range stringsOf(input[k]) {
			in.Commands = append(in.Commands, Command{Key: i, Text: cmd, Paths: pathsInCommand(cmd)})
		}
	}
	return in
}

// sameToolInput fails t where ReadToolInput and encoding/json disagree on raw.
func sameToolInput(t *testing.T, raw []byte) {
	t.Helper()
	if got, want := ReadToolInput(raw), refToolInput(raw); !reflect.DeepEqual(got, want) {
		t.Fatalf("ReadToolInput(%q) = %+v, reference %+v", raw, got, want)
	}
}

// sameFilesTouched fails t where FilesTouched and the reference disagree on
// calls built from s: s as the command and path values of a JSON input, as
// a whole raw input (often not JSON at all), and as an earlier summary.
func sameFilesTouched(t *testing.T, s string) {
	t.Helper()
	in, _ := json.Marshal(map[string]any{"command": s, "cmd": []any{s, 1, s}, "path": s, "files": []string{s, s + ".py"}})
	for _, raw := range []string{s, string(in), `{"command":` + strconv.Quote(s) + `}`, `{"path":"` + s + `","command":"` + s + `"}`,
		"{\"file\":\"a\",\"" + s + "\":\"b.go\"}", `{"cmd":` + s + `}`} {
		sameToolInput(t, []byte(raw))
	}
	msgs := []schema.Message{
		{Turn: schema.Turn{Role: schema.RoleUser, Content: schema.TextContent(FilesTouchedHeading + "\n" + s)}, IsSummary: true},
		{Turn: schema.Turn{Role: schema.RoleUser, Content: schema.TextContent("[m]\n" + MarkerFilesHeading + " " + s)}, IsTruncationMarker: true},
		callMsg(use("1", "bash", string(in)), use("2", "edit", s)),
		callMsg(use("3", "Write_File", `{"file_path":`+strconv.Quote(s)+`}`)),
	}
	if got, want := FilesTouched(msgs), refFilesTouched(msgs); !reflect.DeepEqual(got, want) {
		t.Fatalf("FilesTouched(%q) = %v, reference %v", s, got, want)
	}
}

// TestExtractionMatchesReference compares the scanners with the regexp
// reference over every message of the 43 runs: FilesTouched message by
// message and run by run, ReadToolInput on every tool input, and each
// helper over every command and path value and every output of the runs.
func TestExtractionMatchesReference(t *testing.T) {
	runs := transcripts.Runs(t, transcriptDir)
	messages := 0
	for _, r := range runs {
		t.Run(r.Name, func(t *testing.T) {
			for i := range r.Messages {
				for _, b := range r.Messages[i].Content.BlocksOf() {
					if b.Type == schema.BlockToolUse {
						sameToolInput(t, b.Input)
					}
				}
				one := r.Messages[i : i+1]
				if got, want := FilesTouched(one), refFilesTouched(one); !reflect.DeepEqual(got, want) {
					t.Fatalf("message %s: FilesTouched = %v, reference %v", r.Messages[i].ID, got, want)
				}
				messages++
			}
			if got, want := FilesTouched(r.Messages), refFilesTouched(r.Messages); !reflect.DeepEqual(got, want) {
				t.Fatalf("whole run: FilesTouched = %v, reference %v", got, want)
			}
			// An earlier summary's list is read back the same way.
			list := RenderFilesTouched(FilesTouched(r.Messages))
			if got, want := filesFromList(list), refFilesFromList(list); !reflect.DeepEqual(got, want) {
				t.Fatalf("filesFromList = %v, reference %v", got, want)
			}
		})
	}
	if messages != 7743 {
		t.Errorf("compared %d messages; the runs hold 7743", messages)
	}
	inputs, outputs := corpus(runs)
	for _, s := range inputs {
		sameExtraction(t, s)
	}
	for _, s := range outputs {
		sameOutputExtraction(t, s)
	}
}

// TestExtractionEdgeCases compares the scanners with the reference on the
// corner cases of the patterns they replace, which the runs may lack.
func TestExtractionEdgeCases(t *testing.T) {
	for _, s := range extractionSeeds {
		sameOnAll(t, s)
	}
}

// sameOnAll compares every scanner with its reference on s, s also read as
// a files-touched list.
func sameOnAll(t *testing.T, s string) {
	t.Helper()
	sameExtraction(t, s)
	sameWords(t, s)
	sameFilesTouched(t, s)
	list := FilesTouchedHeading + "\n" + s
	if got, want := filesFromList(list), refFilesFromList(list); !reflect.DeepEqual(got, want) {
		t.Fatalf("filesFromList(%q) = %v, reference %v", list, got, want)
	}
}

var extractionSeeds = []string{
	"", "\n", "a", "tee", "tee ", "tee x.py", "tee -a x.py", "tee -a 'x.py", "tee -a '", "tee -a\t\"", "tee -ab x.py",
	"tee\t-a  \"out.log\"", "xtee a.py", "_tee a.py", ".tee a.py", "tee>a.py", "tee -a", "tee -a ", "tee -a -a b.go",
	"> a.py", ">> a.py", ">>> a.py", "> 'a.py'", ">'\"a.py", "> >b.go", "echo x >a/b.txt 2>&1", "a>b>c.go", "> ", ">",
	"tee -a 'x.py' | tee y.md", "é > ü/ä.go", "x > \xff/a.go", "cat <<EOF > a.py\nb > c.py\nEOF",
	"sed -i s/a/b/ f.go", "sed  -ni x", "sed -n x", "sed --in-place f.go", "sed --in-placex", "sed -", "sed\n-i",
	"xsed -i a.go", "_sed -i a.go", "(sed -i", "sed -I", "sed -Ei", "sed -E1i", "sed", "sed ", "sed\t-zxi a.txt",
	"t/a.py::T::t", "t/a.py::", "::a.py", "a::b::c.py", "t/a.py::x\nb", " t/a.py::x", "src/a.go:12", "src/a.go:12:", "src/a.go:12:3:", "src/a.go::12", "src/a.go:x:12", "a.go:", "a.go:.", "a.go.:",
	":12", "a:1b:2", "pkg/:1", "./:1", "./a.py:1.", "s/a/b/g", "y/a/b/", "s/a/b/c/d", "s/a/b/g1", "s/a/b/-",
	"sx/a/b/", "s/", "s//", "s///", "x/2", "_a/b", ".a/b", "a//b", "/1/2", "~/1", "../1/", "~", "..", "./", ".",
	"-x.py", "http://a/b.py", "/dev/null", "/dev", "/proc", "/sys/", "/devx/a", "1.py", "1e5.py", "inf.py", "nan.go",
	"x.1.py", ".py", "a/.py", "a/1.5.json", "Infinity.go", "-inf.md", "+1.txt", ".5.py", "a/.5.json", "+.5.md", "a/+Inf.go", "N.go", "0x.go", "0x1p2.go", "1_0.go", "a b.go",
	"a\vb.go", "a\u00a0b.go", "\u00a0a.go\u00a0", "a.go\t", "'a.go'", "`a.go`", "a=b.go", "{a,b}.go", "$x/a.go",
	"<returncode>1</returncode>", "<returncode> -12 \n</returncode>", "<returncode>--1</returncode>", "<returncode></returncode>",
	"x<returncode>0</returncode><returncode>2</returncode>", "<returncode>\t7</returncode >",
	`{"command":"cat a.py"}`, `{"path":"x/y.go","path":"z.go"}`, `{"Path":"a.go"}`, `{"pa\u0074h":"a.go"}`, `[1]`, `null`, `{`,
	"ValueError: x", "Errors", "error", "xerror", "error_x", "errorx", "ERROR:", "_ERROR", "exception", "exceptions", "exceptionsx",
	"Exceptional", "NoError1", "an error.", "élerror", "erroré", "TracebackFAILED", "  a \t b  ", "a\u00a0b", "a\u0085 b", " ", "\xffa  b",
	`{}`, ` { } `, `{"command":"a\u0041.py"}`, `{"command":"a\tb\\c\/d\"e\b\f\r\n.py"}`, `{"command":"x"}x`, `{"command":"x",}`,
	`{"command":"x" "path":"y"}`, `{"command" : "cat a.py" , "command":"cat b.py"}`, `{"command":"a\x"}`, "{\"command\":\"a\x01\"}",
	"{\"command\":\"\xffa.py\"}", `{"command":"é.py"}`, `{"command":"ls",}`, `{"command":true}`, `{"command":"ls","n":1}`,
	"\ufeff{\"command\":\"ls a.py\"}", "{\"command\":\"ls a.py\"}\f", `{"command":"ls a.py"`, `{"command":"\`, `{"command":`, `{"`,
	"<a>b</a>", "<>x", "<\n>", "<" + strings.Repeat("a", 40) + ">x", "<" + strings.Repeat("a", 41) + ">x", "<<a>>", "<a<b>c>",
	"<é" + strings.Repeat("a", 39) + ">x", "<" + strings.Repeat("é", 40) + ">x", "<" + strings.Repeat("é", 41) + ">x", "<\xff>x",
	"  <output> \n\n\t</output>", "- a.go (read)", "- a.go (edited)", "- a.go (created)", "- a.go (made)", "- a b (read)",
	"-  a.go (read)", "- a.go  (read)", "- a.go (read) ", "\t- a.go (read)", "- (read)", "- a\fb (read)", "- a\vb (read)",
	"- a.go (read)\n## next\n- b.go (read)", "- é.go (read)", "- \xff (read)",
	"cat <<A > one.md; cat <<-\"B\" > two.md\nx/y.py\nA\nz/w.py\n\tB\ncat q/r.py", "cat <<<x\na/b.py", "cat <<''\nx/y.py\n\na/b.py",
	"cat <<\\E'O'\"F\" >a.py\nx/y.py\nEOF\nb/c.py", "cat <<'E\nb/c.py", "a<<<<E\nb/c.py\nE", "cat << \nb/c.py", "x <<E\nE",
	"- a/{b.go,c.go} (read)", "- a/{b.go} (read)", "- a/{,b.go} (read)", "- {a,b}/c (read)", "- a/b{c,d} (read)", "- a/{b/{c,d} (edited)",
	"- a/** (read; 3 files)", "- ./** (created; 1 file)", "- /** (edited; 12 files)", "- a/** (read; 0 files)", "- a/** (read; 03 files)",
	"- a** (read; 2 files)", "- a/** (read)", "- a/** (read; 2 files) ", "- a/** (made; 2 files)",
	"x.go (read), a/{b,c} (edited), d/** (read; 4 files)", "x.go (read),y.go (read)", "x.go (read), , y.go (read)",
}

// FuzzExtractionMatchesReference looks for inputs on which the scanners and
// the regexp reference disagree.
func FuzzExtractionMatchesReference(f *testing.F) {
	for _, s := range extractionSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sameOnAll(t, s)
	})
}
