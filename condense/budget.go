package condense

import (
	"fmt"
	"strings"

	"github.com/ctxpipe/ctxpipe/textfacts"
)

// Per-section budgets in characters. With the headings they add up to about
// DefaultOfflineMaxChars, so the final cut seldom bites; when it does, it
// cuts the middle and keeps the last section (the latest request, the most
// important for carrying on) whole.
const (
	budgetTask     = 450
	budgetEarlier  = 300
	budgetCurrent  = 300
	budgetConcepts = 150
	budgetFiles    = 400
	budgetCommands = 600
	budgetErrors   = 450
	budgetNotes    = 250
	budgetLatest   = 650
)

// quote writes s as a Markdown quote of at most n characters.
func quote(s string, n int) string {
	s = textfacts.Clip(strings.TrimSpace(s), n)
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		b.WriteString("> ")
		b.WriteString(strings.TrimRight(line, " \t\r"))
		b.WriteByte('\n')
	}
	return b.String()
}

// writeList writes items as bullets from the start until the budget is
// spent, then says how many were left out.
func writeList(b *strings.Builder, items []string, total, budget int, wrap string) {
	if len(items) == 0 {
		b.WriteString("None.\n")
		return
	}
	used, shown := 0, 0
	for _, it := range items {
		line := "- " + wrap + it + wrap + "\n"
		if used+len(line) > budget && shown > 0 {
			break
		}
		b.WriteString(line)
		used += len(line)
		shown++
	}
	if shown < total {
		fmt.Fprintf(b, "- … and %d more\n", total-shown)
	}
}

// writeTail writes the last items that fit the budget, oldest first.
func writeTail(b *strings.Builder, items []string, budget int, wrap string) {
	used, start := 0, len(items)
	for start > 0 {
		line := "- " + wrap + items[start-1] + wrap + "\n"
		if used+len(line) > budget && start < len(items) {
			break
		}
		used += len(line)
		start--
	}
	if start > 0 {
		fmt.Fprintf(b, "- … %d earlier not shown\n", start)
	}
	for _, it := range items[start:] {
		b.WriteString("- " + wrap + it + wrap + "\n")
	}
}
