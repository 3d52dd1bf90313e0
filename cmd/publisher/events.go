package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/schema"
)

// eventFilter is the CTX_EVENTS subject filter for conv ("" = all).
func eventFilter(conv string) string {
	if conv == "" {
		return bus.EventSubjects
	}
	return schema.EventSubjectPrefix + conv + ".>"
}

func runFollow(ctx context.Context, c *cli, args []string) error {
	fs := c.flags()
	conv := fs.String("conv", "", "only this conversation (default: all)")
	asJSON := fs.Bool("json", false, "print each event's raw JSON")
	since := fs.Duration("since", 0, "start with the events of the last DURATION")
	all := fs.Bool("all", false, "start with every stored event")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("unexpected arguments %q", pos)
	}
	if *conv != "" {
		if err := requireConv(*conv); err != nil {
			return err
		}
	}
	cfg := jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{eventFilter(*conv)},
		DeliverPolicy:  jetstream.DeliverNewPolicy,
	}
	switch {
	case *all && *since > 0:
		return usagef("--since and --all exclude each other")
	case *all:
		cfg.DeliverPolicy = jetstream.DeliverAllPolicy
	case *since > 0:
		t := time.Now().Add(-*since)
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &t
	}
	nc, js, err := c.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	gctx, cancel := c.guard(ctx)
	defer cancel()
	cons, err := js.OrderedConsumer(gctx, bus.StreamEvents, cfg)
	if err != nil {
		return fmt.Errorf("follow %s: %w", bus.StreamEvents, c.refused(err))
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("follow %s: %w", bus.StreamEvents, err)
	}
	go func() { // Next blocks; stopping the iterator ends it.
		<-gctx.Done()
		it.Stop()
	}()
	for {
		m, err := it.Next()
		if err != nil {
			if p := c.permission(); p != nil {
				return fmt.Errorf("follow: %w", p)
			}
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil // interrupted: a normal end of follow
			}
			return fmt.Errorf("follow: %w", err)
		}
		printEvent(c, m.Data(), *asJSON)
	}
}

func runReplay(ctx context.Context, c *cli, args []string) error {
	fs := c.flags()
	conv := fs.String("conv", "", "conversation id (required)")
	asJSON := fs.Bool("json", false, "print each event's raw JSON")
	if err := parseConv(fs, args, conv); err != nil {
		return err
	}
	nc, js, err := c.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	gctx, cancel := c.guard(ctx)
	defer cancel()
	n, err := replay(gctx, js, eventFilter(*conv), func(data []byte) { printEvent(c, data, *asJSON) })
	if err != nil {
		return c.refused(err)
	}
	fmt.Fprintf(c.stderr, "%s: %d events\n", *conv, n)
	return nil
}

// replay calls fn with every stored event matching filter, oldest first,
// and returns once it has seen the last one that existed when it started.
func replay(ctx context.Context, js jetstream.JetStream, filter string, fn func([]byte)) (int, error) {
	cons, err := js.OrderedConsumer(ctx, bus.StreamEvents, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{filter},
		DeliverPolicy:  jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return 0, fmt.Errorf("replay %s: %w", bus.StreamEvents, err)
	}
	info := cons.CachedInfo()
	if info == nil || info.NumPending == 0 {
		return 0, nil
	}
	n := 0
	for {
		// The wait bounds a stalled server, not the replay: each fetch
		// returns as soon as messages are there.
		batch, err := cons.Fetch(256, jetstream.FetchMaxWait(30*time.Second))
		if err != nil {
			return n, fmt.Errorf("replay: %w", err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			n++
			fn(m.Data())
			md, err := m.Metadata()
			if err == nil && md.NumPending == 0 {
				return n, nil
			}
		}
		if err := batch.Error(); err != nil {
			return n, fmt.Errorf("replay: %w", err)
		}
		if got == 0 {
			return n, fmt.Errorf("replay: no events within 30s, %d of %d+ read", n, info.NumPending)
		}
		if ctx.Err() != nil {
			return n, ctx.Err()
		}
	}
}

func printEvent(c *cli, data []byte, asJSON bool) {
	if asJSON {
		fmt.Fprintf(c.stdout, "%s\n", data)
		return
	}
	fmt.Fprintln(c.stdout, formatEvent(data, time.Local))
}

// formatEvent renders an event as one readable line, e.g.
//
//	12:01:02 task-42 condense_context 182,304→41,220 tokens (12 msgs, auto, $0.0123)
func formatEvent(data []byte, loc *time.Location) string {
	e, err := schema.DecodeEvent(data)
	if err != nil {
		return fmt.Sprintf("(undecodable event: %v) %s", err, data)
	}
	h := e.Header()
	head := fmt.Sprintf("%s %s %s", time.UnixMilli(h.TS).In(loc).Format("15:04:05"), h.ConversationID, h.Type)
	var body string
	switch e := e.(type) {
	case *schema.CondenseContext:
		body = fmt.Sprintf("%s→%s tokens (%d msgs, %s, $%.4f)", thousands(e.PrevContextTokens), thousands(e.NewContextTokens),
			e.MessagesCondensed, e.Trigger, e.Cost)
		if e.Model != "" {
			body += " " + e.Model
		}
		if e.Instructions != "" {
			body += fmt.Sprintf(" instructions %q", oneLine(e.Instructions, 60))
		}
	case *schema.ToolResultsMasked:
		body = fmt.Sprintf("%s→%s tokens (%d tool results in %d msgs, %s)", thousands(e.PrevContextTokens), thousands(e.NewContextTokens),
			e.Count, e.MessagesMasked, e.Trigger)
	case *schema.SlidingWindowTruncation:
		body = fmt.Sprintf("%s→%s tokens (%d msgs removed)", thousands(e.PrevContextTokens), thousands(e.NewContextTokens), e.MessagesRemoved)
	case *schema.ContextManaging:
		pct := 0.0
		if e.ContextWindow > 0 {
			pct = 100 * float64(e.ContextTokens) / float64(e.ContextWindow)
		}
		body = fmt.Sprintf("%s/%s tokens (%.1f%%, threshold %d%%, %s)", thousands(e.ContextTokens), thousands(e.ContextWindow), pct, e.Threshold, e.Trigger)
	case *schema.CondenseFailed:
		body = fmt.Sprintf("%s (%s, $%.4f)", e.Error, e.Trigger, e.Cost)
		if e.Message != "" {
			body += ": " + e.Message
		}
	case *schema.Rewind:
		body = fmt.Sprintf("to %s (%d msgs removed, %d restored, %d condenses and %d truncations undone",
			time.UnixMilli(e.CutoffTS).In(loc).Format("15:04:05.000"), e.MessagesRemoved, e.MessagesRestored,
			len(e.RemovedCondenseIDs), len(e.RemovedTruncationIDs))
		if len(e.RemovedMaskIDs) > 0 {
			body += fmt.Sprintf(", %d maskings undone", len(e.RemovedMaskIDs))
		}
		body += ")"
	case *schema.InputRejected:
		body = fmt.Sprintf("%s on %s: %s", e.Reason, e.Subject, oneLine(e.Message, 120))
	}
	if h.InputID != "" {
		body += " input " + shortID(h.InputID)
	}
	return head + " " + body
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

func shortID(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}
