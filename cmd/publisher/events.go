package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/client"
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
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *conv != "" {
		if err := requireConv(*conv); err != nil {
			return err
		}
		if *since > 0 {
			return usagef("--since needs CTX_EVENTS: leave out --conv (the service's account only), or use --all")
		}
		// One conversation: through the service (live events, and with
		// --all its stored ones first), which works from a tenant's
		// account too, where CTX_EVENTS cannot be read.
		return followConv(ctx, c, *conv, *all, *asJSON)
	}
	if !*all && *since == 0 {
		// New events of every conversation the user may see: a plain
		// subscription, which a tenant's UI user has too.
		return followLive(ctx, c, *asJSON)
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
	// Only the service's account reads CTX_EVENTS whole; a tenant's user
	// is refused, and should be told what it can do instead.
	const tenantHint = "reading every conversation's stored events needs the service's account; a tenant's user can follow one conversation with --conv ID (and --all)"
	cons, err := js.OrderedConsumer(gctx, bus.StreamEvents, cfg)
	if err != nil {
		if p := c.permission(); p != nil {
			return fmt.Errorf("follow %s: %w (%s)", bus.StreamEvents, p, tenantHint)
		}
		return fmt.Errorf("follow %s: %w", bus.StreamEvents, err)
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
				return fmt.Errorf("follow: %w (%s)", p, tenantHint)
			}
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil // interrupted: a normal end of follow
			}
			return fmt.Errorf("follow: %w", err)
		}
		printEvent(c, m.Data(), *asJSON)
	}
}

// followLive prints every event published from now on, until interrupted.
func followLive(ctx context.Context, c *cli, asJSON bool) error {
	nc, _, err := c.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	msgs := make(chan *nats.Msg, 1024)
	sub, err := nc.ChanSubscribe(bus.EventSubjects, msgs)
	if err != nil {
		return fmt.Errorf("follow: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		return fmt.Errorf("follow: %w", err)
	}
	gctx, cancel := c.guard(ctx)
	defer cancel()
	for {
		select {
		case m := <-msgs:
			printEvent(c, m.Data, asJSON)
		case <-gctx.Done():
			if p := c.permission(); p != nil {
				return fmt.Errorf("follow: %w", p)
			}
			return nil // interrupted: a normal end of follow
		}
	}
}

// followConv prints conv's events as they happen (after its stored ones
// with all), until interrupted.
func followConv(ctx context.Context, c *cli, conv string, all, asJSON bool) error {
	cl, done, err := c.client()
	if err != nil {
		return err
	}
	defer done()
	var opts []client.EventsOption
	if all {
		opts = append(opts, client.Replay(0))
	}
	gctx, cancel := c.guard(ctx)
	defer cancel()
	stream, err := cl.Events(gctx, conv, opts...)
	if err != nil {
		return fmt.Errorf("follow %s: %w", conv, c.refused(err))
	}
	defer stream.Close()
	for ev := range stream.C() {
		if err := printDecoded(c, ev, asJSON); err != nil {
			return err
		}
	}
	if p := c.permission(); p != nil {
		return fmt.Errorf("follow: %w", p)
	}
	if err := stream.Err(); err != nil && ctx.Err() == nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("follow: %w", err)
	}
	return nil
}

func runReplay(ctx context.Context, c *cli, args []string) error {
	fs := c.flags()
	conv := convFlag(fs)
	asJSON := fs.Bool("json", false, "print each event's raw JSON")
	cl, done, err := c.convClient(fs, args, conv)
	if err != nil {
		return err
	}
	defer done()
	gctx, cancel := c.guard(ctx)
	defer cancel()
	n := 0
	for ev, err := range cl.StoredEvents(gctx, *conv, 0) {
		if err != nil {
			return queryFailed(c.refused(err))
		}
		if err := printDecoded(c, ev, *asJSON); err != nil {
			return err
		}
		n++
	}
	fmt.Fprintf(c.stderr, "%s: %d events\n", *conv, n)
	return nil
}

// storedEvents is every stored event of conv, oldest first, read through
// the service (ctx.q.events), which answers from any account.
func storedEvents(ctx context.Context, cl *client.Client, conv string) ([]schema.Event, error) {
	var evs []schema.Event
	for ev, err := range cl.StoredEvents(ctx, conv, 0) {
		if err != nil {
			return nil, err
		}
		evs = append(evs, ev)
	}
	return evs, nil
}

func printDecoded(c *cli, ev schema.Event, asJSON bool) error {
	data, err := schema.Marshal(ev)
	if err != nil {
		return fmt.Errorf("encode event: %w", err)
	}
	printEvent(c, data, asJSON)
	return nil
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
