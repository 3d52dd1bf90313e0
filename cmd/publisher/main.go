// Command publisher is ctxpipe's client: it publishes transcripts and
// synthetic load to CTX_IN, sends control inputs (condense, overflow,
// rewind), asks the queries, and follows or replays the events.
//
//	go run ./cmd/publisher help
//
// main.go dispatches the subcommands and holds their shared flags and
// connection; publish.go publishes a transcript, read by formats.go (turns,
// Anthropic or OpenAI files) and stamped by prepare.go; load.go publishes
// the synthetic workload gen.go generates, with progress.go's progress
// line; queries.go sends the control inputs and asks the queries;
// events.go follows and replays events; plot.go draws a conversation's
// context size.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"sync"
	"syscall"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/client"
	"github.com/ctxpipe/ctxpipe/schema"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// command is one subcommand.
type command struct {
	summary string
	usage   string
	run     func(ctx context.Context, c *cli, args []string) error
}

var commands map[string]command

func init() {
	commands = map[string]command{
		"publish":  {"send a transcript to a conversation", "publish --conv ID [--profile P] [--format auto|turns|anthropic|openai] [--system-file F] [--rate N] [--wait] FILE", runPublish},
		"load":     {"publish a synthetic multi-agent workload", "load --convs N --turns M [--size realistic|small|large] [--seed S] [--profile P] [--rate R] [--wait]", runLoad},
		"follow":   {"print events as they happen", "follow [--conv ID] [--json] [--since DURATION|--all]", runFollow},
		"replay":   {"print a conversation's event history and exit", "replay --conv ID [--json]", runReplay},
		"condense": {"ask for a manual condense", "condense --conv ID [--instructions TEXT]", runControl("condense")},
		"overflow": {"report a context-window-exceeded error", "overflow --conv ID", runControl("overflow")},
		"rewind":   {"rewind a conversation to a timestamp", "rewind --conv ID --ts TS [--include-target]", runControl("rewind")},
		"pin":      {"pin a stored message (or --unpin it): no reduction hides it", "pin --conv ID --message ID [--unpin]", runControl("pin")},
		"history":  {"print a conversation's history", "history --conv ID [--view effective|full] [--wait-for ID] [--timeout D] [--json]", runHistory},
		"status":   {"print a conversation's context status", "status --conv ID [--json]", runStatus},
		"plot":     {"draw a conversation's context size per turn as SVG", "plot --conv ID [--out FILE.svg]", runPlot},
	}
}

// cli is what every command shares: its output streams and connection flags.
type cli struct {
	name   string
	stdout io.Writer
	stderr io.Writer
	conn   bus.ConnConfig

	// denied is closed at the server's first permission violation, so a
	// refused publish fails at once instead of waiting for an ack that
	// never comes; deniedErr says what was refused.
	denied     chan struct{}
	deniedOnce sync.Once
	deniedErr  error
}

// deny records a permission violation (nats calls it on its own goroutine).
func (c *cli) deny(err error) {
	c.deniedOnce.Do(func() {
		c.deniedErr = err
		close(c.denied)
	})
}

// permission returns the recorded violation, if any.
func (c *cli) permission() error {
	select {
	case <-c.denied:
		return c.deniedErr
	default:
		return nil
	}
}

// usageError is a bad command line: exit code 2 and the command's usage.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// replyError is a query answered with {"error":…}: exit code 1, message only.
var errQueryFailed = errors.New("query failed")

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		if len(args) > 1 {
			if c, ok := commands[args[1]]; ok {
				fmt.Fprintf(stdout, "usage: publisher %s\n\n%s\n", c.usage, c.summary)
				return 0
			}
		}
		printHelp(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "publisher: unknown command %q\n\n", args[0])
		printHelp(stderr)
		return 2
	}
	cl := &cli{name: args[0], stdout: stdout, stderr: stderr, denied: make(chan struct{})}
	err := c.run(ctx, cl, args[1:])
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "publisher %s: %s\nusage: publisher %s\n", args[0], ue.msg, c.usage)
		return 2
	case errors.Is(err, errQueryFailed):
		fmt.Fprintf(stderr, "publisher %s: %v\n", args[0], err)
		return 1
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return 130 // interrupted
	}
	fmt.Fprintf(stderr, "publisher %s: %v\n", args[0], err)
	return 1
}

func printHelp(w io.Writer) {
	fmt.Fprintln(w, "usage: publisher <command> [flags]")
	fmt.Fprintln(w, "\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-9s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nEvery command takes --nats-url, --nats-user, --nats-password, --nats-token,")
	fmt.Fprintln(w, "--nats-creds and --nats-nkey (defaults from NATS_URL, NATS_USER, …).")
	fmt.Fprintln(w, "Run 'publisher <command> -h' for a command's flags.")
}

// flags returns a FlagSet for the command with the connection flags on it.
func (c *cli) flags() *flag.FlagSet {
	fs := flag.NewFlagSet("publisher "+c.name, flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	c.conn.RegisterFlags(fs)
	return fs
}

// parse parses args, allowing flags after positional arguments
// (publish FILE --conv x), and returns the positional ones.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, usageError{err.Error()}
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

func requireConv(conv string) error {
	if conv == "" {
		return usagef("--conv is required")
	}
	if !schema.ValidConversationID(conv) {
		return usagef("--conv %q must be 1-128 characters of [A-Za-z0-9_-]", conv)
	}
	return nil
}

// parseFlags parses a command that takes flags only.
func parseFlags(fs *flag.FlagSet, args []string) error {
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("unexpected arguments %q", pos)
	}
	return nil
}

// parseConv parses a command that takes flags only, one of them the
// required --conv.
func parseConv(fs *flag.FlagSet, args []string, conv *string) error {
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	return requireConv(*conv)
}

// convFlag defines the required --conv of a command about one
// conversation.
func convFlag(fs *flag.FlagSet) *string {
	return fs.String("conv", "", "conversation id (required)")
}

// convClient parses a command that takes flags only, one of them the
// required --conv, and connects its client; done closes the connection.
func (c *cli) convClient(fs *flag.FlagSet, args []string, conv *string) (cl *client.Client, done func(), err error) {
	if err := parseConv(fs, args, conv); err != nil {
		return nil, nil, err
	}
	return c.client()
}

// connect connects as this command and returns a JetStream context.
func (c *cli) connect(opts ...jetstream.JetStreamOpt) (*nats.Conn, jetstream.JetStream, error) {
	cfg := c.conn
	if cfg.Name == "" {
		cfg.Name = "ctxpipe-publisher-" + c.name
	}
	if cfg.Log == nil {
		// A command line tool: connection notices only when something is
		// wrong, on the command's own stderr.
		cfg.Log = slog.New(slog.NewTextHandler(c.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	nc, err := bus.Connect(cfg, nats.MaxReconnects(5),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) {
				c.deny(err)
				return
			}
			fmt.Fprintf(c.stderr, "nats: %v\n", err)
		}))
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc, opts...)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	return nc, js, nil
}

// guard returns a context that ends at the server's first permission
// violation, so a refused JetStream API call (say, creating a consumer the
// user may not create) fails at once; context.Cause tells why.
func (c *cli) guard(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	go func() {
		select {
		case <-c.denied:
			cancel(c.deniedErr)
		case <-ctx.Done():
		}
	}()
	return ctx, func() { cancel(nil) }
}

// refused prefers the recorded permission violation over err, which is then
// only its symptom (a cancelled request).
func (c *cli) refused(err error) error {
	if p := c.permission(); p != nil && err != nil {
		return p
	}
	return err
}

// publishInput is bus.PublishInput that fails as soon as the server refuses
// the publish (a user not allowed to send this kind of input).
func (c *cli) publishInput(ctx context.Context, js jetstream.JetStream, subj, id string, data []byte) (*jetstream.PubAck, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		ack *jetstream.PubAck
		err error
	}
	done := make(chan result, 1)
	go func() {
		ack, err := bus.PublishInput(ctx, js, subj, id, data)
		done <- result{ack, err}
	}()
	select {
	case r := <-done:
		return r.ack, r.err
	case <-c.denied:
		return nil, fmt.Errorf("publish %s: %w", subj, c.deniedErr)
	}
}
