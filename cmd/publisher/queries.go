package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/ctxpipe/ctxpipe/client"
	"github.com/ctxpipe/ctxpipe/schema"
)

// runControl returns the command that publishes a condense, overflow,
// rewind or pin input and, unless --wait=false, waits for its outcome.
func runControl(kind schema.InputKind) func(context.Context, *cli, []string) error {
	return func(ctx context.Context, c *cli, args []string) error {
		fs := c.flags()
		conv := convFlag(fs)
		var (
			ts            *int64
			includeTarget *bool
		)
		if kind == schema.KindRewind {
			ts = fs.Int64("ts", 0, "cutoff timestamp, Unix ms (required): the turn at this ts and later are undone")
			includeTarget = fs.Bool("include-target", false, "keep the turn at exactly --ts (what it caused is still undone)")
		}
		var (
			messageID *string
			unpin     *bool
		)
		if kind == schema.KindPin {
			messageID = fs.String("message", "", "id of the stored message to pin (required; from history --view full)")
			unpin = fs.Bool("unpin", false, "unpin it instead")
		}
		var instructions *string
		if kind == schema.KindCondense {
			instructions = fs.String("instructions", "", "what the summary should keep or stress (at most 2,000 characters)")
		}
		wait := fs.Bool("wait", true, "wait until ctxpipe has applied the input, and fail (exit 1) if it was rejected")
		waitTimeout := fs.Duration("wait-timeout", 30*time.Second, "how long --wait waits")
		if err := parseConv(fs, args, conv); err != nil {
			return err
		}
		in := schema.Input{Kind: kind, ID: uuid.NewString(), TS: time.Now().UnixMilli()}
		switch kind {
		case schema.KindCondense:
			in.Trigger, in.Instructions = schema.TriggerManual, *instructions
		case schema.KindPin:
			if *messageID == "" {
				return usagef("--message is required (the id of a stored message)")
			}
			in.MessageID, in.Pinned = *messageID, !*unpin
		case schema.KindRewind:
			switch {
			case *ts == 0:
				return usagef("--ts is required (the cutoff, Unix ms)")
			case *ts < 0:
				return usagef("--ts must be a positive Unix ms timestamp, got %d", *ts)
			}
			in.TS, in.IncludeTarget = *ts, *includeTarget
		}
		data, err := schema.ControlPayload(in)
		if err != nil {
			return err
		}
		nc, js, err := c.connect()
		if err != nil {
			return err
		}
		defer nc.Close()
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		subj := schema.InputSubject(*conv, kind)
		ack, err := c.publishInput(pctx, js, subj, in.ID, data)
		if err != nil {
			return err
		}
		fmt.Fprintln(c.stdout, in.ID)
		fmt.Fprintf(c.stderr, "published %s to %s (stream %s seq %d)\n", kind, subj, ack.Stream, ack.Sequence)
		if !*wait {
			return nil
		}
		cl, err := client.New(nc)
		if err != nil {
			return err
		}
		wctx, cancel := context.WithTimeout(ctx, *waitTimeout)
		defer cancel()
		if err := cl.Wait(wctx, *conv, in.ID); err != nil {
			// A rejection (unknown_target, say) is the answer, not a
			// failure to publish: say it and exit 1.
			return err
		}
		if kind == schema.KindPin { // a pin emits no event
			fmt.Fprintf(c.stderr, "applied pin %s\n", in.ID)
		} else {
			fmt.Fprintf(c.stderr, "applied %s %s (publisher replay --conv %s shows what it did)\n", kind, in.ID, *conv)
		}
		return nil
	}
}

func runHistory(ctx context.Context, c *cli, args []string) error {
	fs := c.flags()
	conv := convFlag(fs)
	view := fs.String("view", "effective", "effective (what the agent sends its model) or full (everything, with tags)")
	waitFor := fs.String("wait-for", "", "input id: wait until ctxpipe has applied it")
	timeout := fs.Duration("timeout", 30*time.Second, "how long to wait for the reply")
	asJSON := fs.Bool("json", false, "print the reply's JSON")
	if err := parseConv(fs, args, conv); err != nil {
		return err
	}
	req := schema.HistoryRequest{ConversationID: *conv, View: schema.View(*view), WaitFor: *waitFor}
	if err := req.Validate(); err != nil {
		return usageError{err.Error()}
	}
	cl, done, err := c.client()
	if err != nil {
		return err
	}
	defer done()
	opts := []client.HistoryOption{client.View(req.View)}
	if *waitFor != "" {
		opts = append(opts, client.WaitFor(*waitFor))
	}
	// The wait (capped by the service at schema.MaxQueryTimeout) takes
	// what --timeout leaves after the reply's way back.
	qctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	h, err := cl.History(qctx, *conv, opts...)
	if err != nil {
		return queryFailed(err)
	}
	if *asJSON {
		return c.printJSON(h)
	}
	printHistory(c.stdout, h)
	return nil
}

func printHistory(w io.Writer, h *schema.HistoryReply) {
	total := 0
	for i := range h.Messages {
		m := &h.Messages[i]
		total += m.Tokens
		fmt.Fprintf(w, "%s  %-9s %-24s %7s  %s\n", time.UnixMilli(m.TS).Format("2006-01-02 15:04:05"),
			m.Role, tags(m), thousands(m.Tokens), preview(m.Content, 80))
	}
	fmt.Fprintf(w, "%s: %d messages (%s view), %s tokens\n", h.ConversationID, len(h.Messages), h.View, thousands(total))
}

// tags summarizes a stored message's non-destructive tags.
func tags(m *schema.Message) string {
	var t []string
	switch {
	case m.IsSummaryAck:
		t = append(t, "summary-ack")
	case m.IsSummary:
		t = append(t, "summary")
	}
	if m.IsTruncationMarker {
		t = append(t, "marker")
	}
	if m.CondenseParent != "" {
		t = append(t, "condensed")
	}
	if m.TruncationParent != "" {
		t = append(t, "truncated")
	}
	if len(t) == 0 {
		return "-"
	}
	return "[" + strings.Join(t, ",") + "]"
}

// preview is a one-line description of content, at most n runes.
func preview(c schema.Content, n int) string {
	var parts []string
	for _, b := range c.BlocksOf() {
		switch b.Type {
		case schema.BlockText:
			parts = append(parts, b.Text)
		case schema.BlockReasoning:
			parts = append(parts, "(thinking) "+b.Text)
		case schema.BlockToolUse:
			parts = append(parts, b.Name+string(b.Input))
		case schema.BlockToolResult:
			s := "result"
			if b.IsError {
				s = "error"
			}
			if b.Content != nil {
				s += ": " + preview(*b.Content, n)
			}
			parts = append(parts, s)
		case schema.BlockImage:
			parts = append(parts, "[image]")
		}
	}
	s := strings.Join(strings.Fields(strings.Join(parts, " | ")), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

func runStatus(ctx context.Context, c *cli, args []string) error {
	fs := c.flags()
	conv := convFlag(fs)
	asJSON := fs.Bool("json", false, "print the reply's JSON")
	cl, done, err := c.convClient(fs, args, conv)
	if err != nil {
		return err
	}
	defer done()
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := cl.Status(qctx, *conv)
	if err != nil {
		return queryFailed(err)
	}
	if *asJSON {
		return c.printJSON(s)
	}
	fmt.Fprintf(c.stdout, "conversation   %s\nprofile        %s\ncontext        %s / %s tokens (%.1f%%; allowed %s, threshold %d%%)\n"+
		"messages       %d (%d hidden)\ncondensations  %d\ntruncations    %d\n",
		s.ConversationID, s.ProfileID, thousands(s.ContextTokens), thousands(s.ContextWindow), s.Percent,
		thousands(s.AllowedTokens), s.Threshold, s.Messages, s.HiddenMessages, s.Condensations, s.Truncations)
	return nil
}

// client connects as this command (with its permission-violation handling)
// and returns a ctxpipe client over the connection, and how to close it.
func (c *cli) client() (*client.Client, func(), error) {
	nc, _, err := c.connect()
	if err != nil {
		return nil, nil, err
	}
	cl, err := client.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return cl, nc.Close, nil
}

// queryFailed marks a query the service answered with an error (or a
// rejected wait_for input) as errQueryFailed: exit code 1, message only.
func queryFailed(err error) error {
	var qe *client.QueryError
	var rej *client.RejectedError
	if errors.As(err, &qe) || errors.As(err, &rej) {
		return fmt.Errorf("%w: %w", errQueryFailed, err)
	}
	return err
}

// printJSON writes v's JSON on one line of stdout (the --json output).
func (c *cli) printJSON(v any) error {
	b, err := schema.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(c.stdout, "%s\n", b)
	return err
}
