package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/client"
	"github.com/ctxpipe/ctxpipe/client/clienttest"
	"github.com/ctxpipe/ctxpipe/schema"
)

// Every example runs against the real service, started in process by
// clienttest: an embedded NATS JetStream server, SQLite, the engine with
// the offline condenser, and a profile with a 4,000-token window whose
// threshold (75 %) a dozen of the turns below cross.

// startService starts ctxpipe and returns its NATS URL and how to stop it.
func startService() (url string, stop func()) {
	svc, err := clienttest.Start(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	return svc.URL, func() { _ = svc.Close() }
}

// connect starts ctxpipe and a client of it.
func connect() (c *client.Client, stop func()) {
	url, stopService := startService()
	c, err := client.Connect(bus.ConnConfig{URL: url})
	if err != nil {
		log.Fatal(err)
	}
	return c, func() { c.Close(); stopService() }
}

// turn is the i-th turn of a conversation, about 300 tokens once counted.
func turn(conv string, i int) schema.Turn {
	role := schema.RoleUser
	if i%2 == 1 {
		role = schema.RoleAssistant
	}
	return schema.Turn{ConversationID: conv, TS: 1_750_000_000_000 + int64(i)*1000, Role: role,
		Content: schema.TextContent(fmt.Sprintf("turn %d:%s", i, strings.Repeat(" context", 200)))}
}

// appendTurns appends n turns and waits until the last is applied.
func appendTurns(ctx context.Context, c *client.Client, conv string, n int) (lastID string) {
	for i := range n {
		id, err := c.Append(ctx, turn(conv, i))
		if err != nil {
			log.Fatal(err)
		}
		lastID = id
	}
	if err := c.Wait(ctx, conv, lastID); err != nil {
		log.Fatal(err)
	}
	return lastID
}

func ExampleNew() {
	url, stop := startService()
	defer stop()
	// A program that has its own connection hands it over; it stays open
	// after the client is done.
	nc, err := nats.Connect(url)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	c, err := client.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	_, err = c.Status(context.Background(), "nobody-yet")
	fmt.Println(errors.Is(err, client.ErrNotFound))
	// Output: true
}

func ExampleConnect() {
	url, stop := startService()
	defer stop()
	// bus.ConnConfig carries the credentials (user/password, token, creds,
	// nkey) and registers the usual --nats-* flags.
	c, err := client.Connect(bus.ConnConfig{URL: url, Name: "my-agent"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	id, err := c.Append(context.Background(), schema.Turn{ConversationID: "task-1", Role: schema.RoleUser,
		Content: schema.TextContent("Add a retry to the fetcher.")})
	fmt.Println(err == nil && len(id) == 36)
	// Output: true
}

func ExampleWithTimeout() {
	url, stop := startService()
	defer stop()
	// Calls whose context has no deadline give up after 2 s.
	c, err := client.Connect(bus.ConnConfig{URL: url}, client.WithTimeout(2*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	// An input nobody published is never applied: the wait ends with the
	// client's timeout.
	err = c.Wait(context.Background(), "task-1", "00000000-0000-4000-8000-000000000000")
	fmt.Println(errors.Is(err, client.ErrTimeout))
	// Output: true
}

func ExampleClient_Append() {
	c, stop := connect()
	defer stop()
	ctx := context.Background()
	id, err := c.Append(ctx, schema.Turn{ConversationID: "task-42", Role: schema.RoleUser,
		Content: schema.TextContent("Why does the build fail on arm64?")})
	if err != nil {
		log.Fatal(err)
	}
	// The turn is in the stream; Wait until the service has applied it.
	if err := c.Wait(ctx, "task-42", id); err != nil {
		log.Fatal(err)
	}
	h, err := c.History(ctx, "task-42")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(h.Messages), h.Messages[0].ID == id, h.Messages[0].Content.Text)
	// Output: 1 true Why does the build fail on arm64?
}

func ExampleClient_Wait() {
	c, stop := connect()
	defer stop()
	ctx := context.Background()
	// "robot" is no role: the service rejects the turn, and Wait says why.
	id, err := c.Append(ctx, schema.Turn{ConversationID: "task-42", Role: "robot", Content: schema.TextContent("beep")})
	if err != nil {
		log.Fatal(err)
	}
	err = c.Wait(ctx, "task-42", id)
	var rej *client.RejectedError
	if errors.As(err, &rej) {
		fmt.Println(rej.Reason, rej.InputID == id, errors.Is(err, client.ErrRejected))
	}
	// Output: bad_role true true
}

func ExampleClient_History() {
	c, stop := connect()
	defer stop()
	ctx := context.Background()
	// The tenth turn crosses the threshold: the first message, a summary
	// and the last three stay; two more turns follow.
	appendTurns(ctx, c, "task-42", 12)
	eff, err := c.History(ctx, "task-42")
	if err != nil {
		log.Fatal(err)
	}
	full, err := c.History(ctx, "task-42", client.View(schema.ViewFull))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("effective: %d messages, the second a summary: %v\n", len(eff.Messages), eff.Messages[1].IsSummary)
	fmt.Printf("full: %d messages\n", len(full.Messages))
	// Output:
	// effective: 7 messages, the second a summary: true
	// full: 13 messages
}

func ExampleView() {
	c, stop := connect()
	defer stop()
	ctx := context.Background()
	appendTurns(ctx, c, "task-42", 12)
	// The full view holds the hidden messages too, tagged with the condense
	// that hid them.
	full, err := c.History(ctx, "task-42", client.View(schema.ViewFull))
	if err != nil {
		log.Fatal(err)
	}
	hidden := 0
	for _, m := range full.Messages {
		if m.CondenseParent != "" {
			hidden++
		}
	}
	fmt.Println(len(full.Messages), "stored,", hidden, "hidden by the summary")
	// Output: 13 stored, 6 hidden by the summary
}

func ExampleWaitFor() {
	c, stop := connect()
	defer stop()
	ctx := context.Background()
	id, err := c.Append(ctx, schema.Turn{ConversationID: "task-42", Role: schema.RoleUser, Content: schema.TextContent("hello")})
	if err != nil {
		log.Fatal(err)
	}
	// Read the history that holds the turn just published: one request.
	h, err := c.History(ctx, "task-42", client.WaitFor(id))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(h.Messages[len(h.Messages)-1].ID == id)
	// Output: true
}

func ExamplePageSize() {
	c, stop := connect()
	defer stop()
	ctx := context.Background()
	appendTurns(ctx, c, "task-42", 8)
	// History follows next_cursor: the whole view, read 3 messages a request.
	h, err := c.History(ctx, "task-42", client.PageSize(3))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(h.Messages), h.Total, h.NextCursor == "")
	// Output: 8 8 true
}

func ExampleClient_HistoryPages() {
	c, stop := connect()
	defer stop()
	ctx := context.Background()
	appendTurns(ctx, c, "task-42", 8)
	for page, err := range c.HistoryPages(ctx, "task-42", client.PageSize(3)) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%d messages of %d, more: %v\n", len(page.Messages), page.Total, page.NextCursor != "")
	}
	// Output:
	// 3 messages of 8, more: true
	// 3 messages of 8, more: true
	// 2 messages of 8, more: false
}

func ExampleCursor() {
	c, stop := connect()
	defer stop()
	ctx := context.Background()
	appendTurns(ctx, c, "task-42", 8)
	// A UI shows the first page now and the rest when asked: it keeps the
	// page's NextCursor and starts from there.
	var next string
	for page, err := range c.HistoryPages(ctx, "task-42", client.PageSize(5)) {
		if err != nil {
			log.Fatal(err)
		}
		next = page.NextCursor
		break
	}
	for page, err := range c.HistoryPages(ctx, "task-42", client.PageSize(5), client.Cursor(next)) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(len(page.Messages), page.Messages[0].Content.Text[:7])
	}
	// Output: 3 turn 5:
}

func ExampleClient_Status() {
	c, stop := connect()
	defer stop()
	ctx := context.Background()
	appendTurns(ctx, c, "task-42", 12)
	st, err := c.Status(ctx, "task-42")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("profile %s, window %d, threshold %d%%, %d messages (%d hidden), %d condense\n",
		st.ProfileID, st.ContextWindow, st.Threshold, st.Messages, st.HiddenMessages, st.Condensations)
	fmt.Println(st.ContextTokens < st.ContextWindow*st.Threshold/100)
	// Output:
	// profile default, window 4000, threshold 75%, 13 messages (6 hidden), 1 condense
	// true
}

func ExampleClient_Condense() {
	c, stop := connect()
	defer stop()
	ctx := context.Background()
	appendTurns(ctx, c, "task-42", 6) // under the threshold
	id, err := c.Condense(ctx, "task-42", "Keep the failing test names.")
	if err != nil {
		log.Fatal(err)
	}
	h, err := c.History(ctx, "task-42", client.WaitFor(id))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(h.Messages), h.Messages[1].IsSummary)
	// Output: 5 true
}

func ExampleClient_Pin() {
	c, stop := connect()
	defer stop()
	ctx := context.Background()
	appendTurns(ctx, c, "task-42", 8)
	full, err := c.History(ctx, "task-42", client.View(schema.ViewFull))
	if err != nil {
		log.Fatal(err)
	}
	// The assistant's first answer must reach the model verbatim.
	keep := full.Messages[1].ID
	id, err := c.Pin(ctx, "task-42", keep, true)
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Wait(ctx, "task-42", id); err != nil {
		log.Fatal(err)
	}
	id, err = c.Condense(ctx, "task-42", "")
	if err != nil {
		log.Fatal(err)
	}
	h, err := c.History(ctx, "task-42", client.WaitFor(id))
	if err != nil {
		log.Fatal(err)
	}
	kept, summarized := false, false
	for _, m := range h.Messages {
		kept = kept || m.ID == keep
		summarized = summarized || m.IsSummary
	}
	fmt.Println("summarized:", summarized, "pinned answer kept:", kept)
	// Output: summarized: true pinned answer kept: true
}

func ExampleClient_Overflow() {
	c, stop := connect()
	defer stop()
	ctx := context.Background()
	appendTurns(ctx, c, "task-42", 8)
	// The provider said the context window was exceeded: reduce by force.
	id, err := c.Overflow(ctx, "task-42")
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Wait(ctx, "task-42", id); err != nil {
		log.Fatal(err)
	}
	st, err := c.Status(ctx, "task-42")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(st.Condensations+st.Truncations > 0, st.HiddenMessages > 0)
	// Output: true true
}

func ExampleClient_Rewind() {
	c, stop := connect()
	defer stop()
	ctx := context.Background()
	appendTurns(ctx, c, "task-42", 12) // condensed at the tenth turn
	// Back to the ninth turn, keeping it: the condense after it is undone
	// and the messages it hid come back.
	id, err := c.Rewind(ctx, "task-42", turn("task-42", 8).TS, true)
	if err != nil {
		log.Fatal(err)
	}
	h, err := c.History(ctx, "task-42", client.WaitFor(id))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(h.Messages), h.Messages[len(h.Messages)-1].Content.Text[:7])
	// Output: 9 turn 8:
}

func ExampleClient_Events() {
	c, stop := connect()
	defer stop()
	ctx := context.Background()
	// Live from now: subscribe before the conversation exists.
	events, err := c.Events(ctx, "task-42")
	if err != nil {
		log.Fatal(err)
	}
	defer events.Close()
	appendTurns(ctx, c, "task-42", 10)
	for ev := range events.C() {
		switch ev := ev.(type) {
		case *schema.ContextManaging:
			fmt.Println(ev.Type, ev.Trigger)
		case *schema.CondenseContext:
			fmt.Println(ev.Type, ev.Trigger, ev.Model, ev.NewContextTokens < ev.PrevContextTokens)
			return
		}
	}
	// Output:
	// context_managing auto
	// condense_context auto offline-extractive true
}

func ExampleReplay() {
	c, stop := connect()
	defer stop()
	ctx := context.Background()
	appendTurns(ctx, c, "task-42", 10) // a condense, before anyone listens
	id, err := c.Condense(ctx, "task-42", "")
	if err != nil {
		log.Fatal(err)
	}
	// The stored events first, then the live ones: none lost, none twice.
	events, err := c.Events(ctx, "task-42", client.Replay(0))
	if err != nil {
		log.Fatal(err)
	}
	defer events.Close()
	for ev := range events.C() {
		fmt.Println(ev.Header().Type)
		if ev.Header().InputID == id && ev.Header().Type != schema.EventContextManaging {
			break
		}
	}
	// Output:
	// context_managing
	// condense_context
	// context_managing
	// condense_context
}

func ExampleWithProgress() {
	c, stop := connect()
	defer stop()
	ctx := context.Background()
	// context_managing arrives as the condense starts, not when it commits.
	events, err := c.Events(ctx, "task-42", client.WithProgress())
	if err != nil {
		log.Fatal(err)
	}
	defer events.Close()
	appendTurns(ctx, c, "task-42", 10)
	n := 0
	for ev := range events.C() {
		fmt.Println(ev.Header().Type)
		if n++; ev.Header().Type == schema.EventCondenseContext {
			break
		}
	}
	// Output:
	// context_managing
	// condense_context
}

func ExampleEventStream_Err() {
	c, stop := connect()
	defer stop()
	ctx, cancel := context.WithCancel(context.Background())
	events, err := c.Events(ctx, "task-42")
	if err != nil {
		log.Fatal(err)
	}
	cancel()
	for range events.C() {
	}
	fmt.Println(events.Err())
	events.Close() // after Close alone, Err is nil
	// Output: context canceled
}

func ExampleQueryError() {
	c, stop := connect()
	defer stop()
	_, err := c.History(context.Background(), "no-such-conversation")
	var qe *client.QueryError
	if errors.As(err, &qe) {
		fmt.Println(qe.Code, errors.Is(err, client.ErrNotFound))
	}
	// Output: not_found true
}

func ExampleRejectedError() {
	c, stop := connect()
	defer stop()
	ctx := context.Background()
	// A tool result whose call the conversation never made.
	id, err := c.Append(ctx, schema.Turn{ConversationID: "task-42", Role: schema.RoleUser,
		Content: schema.BlockContent(schema.Block{Type: schema.BlockToolResult, ToolUseID: "toolu_missing",
			Content: &schema.Content{Text: "ok"}})})
	if err != nil {
		log.Fatal(err)
	}
	err = c.Wait(ctx, "task-42", id)
	var rej *client.RejectedError
	if errors.As(err, &rej) {
		fmt.Println(rej.Reason)
	}
	// Output: orphan_tool_result
}

func ExampleClient_Close() {
	url, stop := startService()
	defer stop()
	nc, err := nats.Connect(url)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	c, err := client.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	c.Close() // the connection was the caller's: it stays open
	fmt.Println(nc.IsConnected())
	// Output: true
}

func ExampleClient_Track() {
	c, stop := connect()
	defer stop()
	ctx := context.Background()
	// An agent reads its effective history after every turn; the Tracker
	// asks only for what was appended since its last read.
	history := c.Track("task-42")
	for i := range 12 {
		id, err := c.Append(ctx, turn("task-42", i))
		if err != nil {
			log.Fatal(err)
		}
		h, err := history.Read(ctx, id)
		if err != nil {
			log.Fatal(err)
		}
		if h.Reset && i > 0 {
			fmt.Printf("turn %d: the view changed, %d messages\n", i, len(h.Messages))
		}
	}
	h, err := history.Read(ctx, "")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(h.Messages), "messages now")
	// Output:
	// turn 9: the view changed, 5 messages
	// 7 messages now
}

func ExampleWithTenant() {
	url, stop := startService()
	defer stop()
	nc, err := nats.Connect(url)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	// In the service's account, an operator's tool reaches tenant acme's
	// conversation c1 (agents inside acme's account just say c1).
	acme, err := client.New(nc, client.WithTenant("acme"))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	if _, err := acme.History(ctx, "c1", client.WaitFor(appendTurns(ctx, acme, "c1", 2))); err != nil {
		log.Fatal(err)
	}
	plain, err := client.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	_, err = plain.Status(ctx, "c1")
	fmt.Println(errors.Is(err, client.ErrNotFound))
	// Output: true
}

func ExampleClient_StoredEvents() {
	c, stop := connect()
	defer stop()
	ctx := context.Background()
	appendTurns(ctx, c, "task-42", 10)
	id, err := c.Condense(ctx, "task-42", "")
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Wait(ctx, "task-42", id); err != nil {
		log.Fatal(err)
	}
	// What happened so far, and no more: the sequence ends.
	for ev, err := range c.StoredEvents(ctx, "task-42", 0) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(ev.Header().Type, ev.Header().InputID == id)
	}
	// Output:
	// context_managing false
	// condense_context false
	// context_managing true
	// condense_context true
}
