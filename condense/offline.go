package condense

import (
	"context"
	"fmt"
	"strings"

	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/textfacts"
)

// OfflineModel is the Summary.Model of the offline condenser.
const OfflineModel = "offline-extractive"

// DefaultOfflineMaxChars bounds an offline summary, whatever the input size,
// so that condensing a long conversation really shrinks it.
const DefaultOfflineMaxChars = 4000

// Offline is a deterministic extractive condenser: it needs no network and
// quotes the conversation instead of paraphrasing it. It writes the same six
// headings as the Detailed prompt: the task as first stated, the latest
// assistant note and command, the tools and file types used, the files
// touched (from tool inputs and commands), the commands run, the errors seen
// and short assistant notes, and the latest user request verbatim. The same
// messages always give the same bytes. The zero value is ready to use.
type Offline struct {
	// MaxChars bounds the summary; 0 means DefaultOfflineMaxChars.
	MaxChars int
}

// Summarize condenses req.Messages. The final instruction turn the engine
// appends is recognized (prompts.IsFinalInstruction) and ignored. The prompt
// is not used: there is no model to follow it.
func (o *Offline) Summarize(ctx context.Context, req schema.SummaryRequest) (schema.Summary, error) {
	if err := ctx.Err(); err != nil {
		return schema.Summary{}, fmt.Errorf("offline summarize: %w", err)
	}
	limit := o.MaxChars
	if limit <= 0 {
		limit = DefaultOfflineMaxChars
	}
	f := extract(source(req))
	body, tail := f.render()
	text := textfacts.Clip(body, limit-len([]rune(tail))-2) + "\n\n" + tail
	// Outside the bound: the last error line and the files touched are
	// what an agent most needs verbatim, and each is bounded on its own.
	if errs := lastDistinct(f.lastErrors, lastErrorsShown); len(errs) > 0 {
		// One buffer: appending to text would copy the summary per piece.
		var b strings.Builder
		b.WriteString(text)
		b.WriteString("\n\n## Last errors seen (verbatim, most recent last)")
		for _, e := range errs {
			b.WriteString("\n- ")
			if e.call != "" {
				b.WriteString("`" + textfacts.Clip(e.call, 80) + "`: ")
			}
			b.WriteString(e.line)
		}
		text = b.String()
	}
	return schema.Summary{Text: textfacts.WithFileList(text, f.touched.List()), Model: OfflineModel}, nil
}

// source is the request's span with tool blocks intact.
func source(req schema.SummaryRequest) []schema.Message {
	if req.Source != nil {
		return req.Source
	}
	return req.Messages
}

// lastErrorsShown is how many results' last error lines a summary quotes:
// the span's last results may be context the engine added (the results of
// its last calls, kept whole after it), so one line is not enough.
const lastErrorsShown = 3

// lastDistinct is the last n entries of errs with distinct lines, in order.
func lastDistinct(errs []callError, n int) []callError {
	var out []callError
	seen := map[string]bool{}
	for i := len(errs) - 1; i >= 0 && len(out) < n; i-- {
		if !seen[errs[i].line] {
			seen[errs[i].line] = true
			out = append(out, errs[i])
		}
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}
