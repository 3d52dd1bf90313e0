package condense

import (
	"fmt"
	"path"
	"sort"
	"strings"

	"github.com/ctxpipe/ctxpipe/prompts"
	"github.com/ctxpipe/ctxpipe/textfacts"
)

// render writes the summary under the Detailed prompt's headings: the body
// holds sections 1 to 5, the tail section 6.
func (f *facts) render() (body, tail string) {
	var b strings.Builder
	sec := prompts.DetailedSections
	fmt.Fprintf(&b, "Offline extractive summary of %d messages (%d tool calls, %d failed). "+
		"Every line below is quoted or counted from the conversation; no model wrote it.\n", f.messages, f.toolCalls, f.failed)

	fmt.Fprintf(&b, "\n## %s\n", sec[0])
	if f.task != "" {
		b.WriteString("Task as first stated:\n")
		b.WriteString(quote(f.task, budgetTask))
	} else {
		b.WriteString("No user request in the condensed part.\n")
	}
	if f.earlier != "" {
		b.WriteString("Earlier summary (start):\n")
		b.WriteString(quote(f.earlier, budgetEarlier))
	}

	fmt.Fprintf(&b, "\n## %s\n", sec[1])
	if f.lastNote == "" && f.lastCommand == "" {
		b.WriteString("None.\n")
	}
	if f.lastNote != "" {
		b.WriteString("Latest assistant note:\n")
		b.WriteString(quote(textfacts.CollapseSpace(f.lastNote), budgetCurrent))
	}
	if f.lastCommand != "" {
		fmt.Fprintf(&b, "Last command: `%s`\n", f.lastCommand)
	}

	fmt.Fprintf(&b, "\n## %s\n", sec[2])
	concepts := []string{}
	if len(f.tools) > 0 {
		concepts = append(concepts, "Tools used: "+counted(f.tools, 6))
	}
	exts := map[string]int{}
	for p := range f.files {
		if e := path.Ext(p); e != "" && textfacts.KnownExt(e[1:]) {
			exts[e]++
		}
	}
	if len(exts) > 0 {
		concepts = append(concepts, "File types: "+counted(exts, 6))
	}
	writeList(&b, concepts, len(concepts), budgetConcepts, "")

	fmt.Fprintf(&b, "\n## %s\n", sec[3])
	files := ranked(f.files, byCount)
	writeList(&b, files, len(files), budgetFiles, "")

	fmt.Fprintf(&b, "\n## %s\n", sec[4])
	cmds := ranked(f.commands, byLast)
	if len(cmds) > 0 {
		fmt.Fprintf(&b, "Commands run (%d distinct, most recent last):\n", len(cmds))
		writeTail(&b, cmds, budgetCommands, "`")
	}
	if len(f.errors) > 0 {
		fmt.Fprintf(&b, "Errors seen (%d, most recent last):\n", len(f.errors))
		writeTail(&b, f.errors, budgetErrors, "")
	}
	notes := dedupe(f.notes)
	if len(notes) > 0 {
		b.WriteString("Notes from the assistant (most recent last):\n")
		writeTail(&b, notes, budgetNotes, "")
	}
	if len(cmds) == 0 && len(f.errors) == 0 && len(notes) == 0 {
		b.WriteString("None.\n")
	}

	body = strings.TrimRight(b.String(), "\n")
	b.Reset()
	fmt.Fprintf(&b, "## %s\n", sec[5])
	switch {
	case f.latest == "":
		b.WriteString("None.\n")
	case f.latest == f.task:
		b.WriteString("Latest user request: the task quoted in section 1, unchanged since.\n")
	default:
		b.WriteString("Latest user request (verbatim):\n")
		b.WriteString(quote(f.latest, budgetLatest))
	}
	return body, strings.TrimRight(b.String(), "\n")
}

// counted renders "a (3), b (1)": the n most frequent, ties by name.
func counted(m map[string]int, n int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if m[keys[i]] != m[keys[j]] {
			return m[keys[i]] > m[keys[j]]
		}
		return keys[i] < keys[j]
	})
	parts := make([]string, 0, n)
	for i, k := range keys {
		if i == n {
			parts = append(parts, fmt.Sprintf("%d more", len(keys)-n))
			break
		}
		parts = append(parts, fmt.Sprintf("%s (%d)", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// dedupe keeps the last occurrence of each string, in order.
func dedupe(items []string) []string {
	last := map[string]int{}
	for i, s := range items {
		last[s] = i
	}
	out := make([]string, 0, len(last))
	for i, s := range items {
		if last[s] == i {
			out = append(out, s)
		}
	}
	return out
}
