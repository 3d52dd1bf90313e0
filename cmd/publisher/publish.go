package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/client"
	"github.com/ctxpipe/ctxpipe/schema"
)

// window bounds the publishes in flight (sent, not yet acked).
const window = 256

func runPublish(ctx context.Context, c *cli, args []string) error {
	fs := c.flags()
	conv := convFlag(fs)
	profile := fs.String("profile", "", "profile id for every turn (default: keep the file's, else the service default)")
	format := fs.String("format", "auto", "transcript format: auto, turns, anthropic or openai")
	systemFile := fs.String("system-file", "", "system prompt file (default: FILE's .system.txt sibling when it exists)")
	rate := fs.Float64("rate", 0, "turns per second (0 = as fast as acks allow)")
	wait := fs.Bool("wait", false, "then wait until ctxpipe has applied the last turn and print the effective history size")
	waitTimeout := fs.Duration("wait-timeout", 60*time.Second, "how long --wait waits")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("want exactly one transcript FILE (- for stdin), got %d", len(pos))
	}
	if err := requireConv(*conv); err != nil {
		return err
	}
	f, err := ParseFormat(*format)
	if err != nil {
		return usageError{err.Error()}
	}
	turns, err := loadTranscript(pos[0], f, *systemFile, PrepareOptions{Conv: *conv, Profile: *profile, Now: time.Now().UnixMilli(),
		Publisher: c.conn.User + "\x00" + c.conn.CredsFile + "\x00" + c.conn.NKeyFile})
	if err != nil {
		return err
	}

	nc, js, err := c.connect(jetstream.WithPublishAsyncMaxPending(window))
	if err != nil {
		return err
	}
	defer nc.Close()
	p := &publisher{js: js, rate: *rate, progress: newProgress(c.stderr, "published", len(turns)),
		denied: c.denied, deniedErr: c.permission, inOrder: true}
	next := sliceSource(turns)
	st, err := p.run(ctx, next)
	fmt.Fprintln(c.stderr, st.summary())
	if err != nil {
		return err
	}
	if *wait {
		last := turns[len(turns)-1]
		cl, err := client.New(nc)
		if err != nil {
			return err
		}
		wctx, cancel := context.WithTimeout(ctx, *waitTimeout)
		defer cancel()
		reply, err := cl.History(wctx, *conv, client.WaitFor(last.ID))
		if err != nil {
			return queryFailed(err)
		}
		fmt.Fprintf(c.stdout, "%s: %d effective messages after turn %s\n", *conv, len(reply.Messages), last.ID)
	}
	return nil
}

// loadTranscript reads, converts and prepares a transcript file.
func loadTranscript(path string, f Format, systemFile string, o PrepareOptions) ([]schema.Turn, error) {
	var (
		data []byte
		err  error
	)
	if path == "-" {
		data, err = io.ReadAll(os.Stdin)
	} else {
		data, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, fmt.Errorf("read transcript: %w", err)
	}
	tr, err := ParseTranscript(data, f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if systemFile == "" && path != "-" {
		// Our transcripts keep the system prompt beside the turns.
		sib := strings.TrimSuffix(path, filepath.Ext(path)) + ".system.txt"
		if _, err := os.Stat(sib); err == nil {
			systemFile = sib
		}
	}
	if systemFile != "" {
		b, err := os.ReadFile(systemFile)
		if err != nil {
			return nil, fmt.Errorf("system prompt: %w", err)
		}
		o.SystemPrompt = strings.TrimRight(string(b), "\n")
	}
	turns, err := Prepare(tr, o)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return turns, nil
}

// source yields the turns to publish, in order; ok is false at the end.
type source func() (t schema.Turn, ok bool)

func sliceSource(turns []schema.Turn) source {
	i := 0
	return func() (schema.Turn, bool) {
		if i == len(turns) {
			return schema.Turn{}, false
		}
		i++
		return turns[i-1], true
	}
}

// publisher sends turns with asynchronous JetStream publishes, at most
// window in flight, and collects the acks in order.
type publisher struct {
	js       jetstream.JetStream
	rate     float64 // turns/s; 0 = unlimited
	progress *progress
	// onAck, if set, is called after each turn is acked (by the collector).
	onAck func(t *schema.Turn, sent time.Time)
	// denied, when closed, means the server refused our publishes;
	// deniedErr then says why.
	denied    <-chan struct{}
	deniedErr func() error
	// inOrder sends a conversation's next turn only once the previous one
	// is acked (or failed for good), so that a retried publish cannot land
	// after its successors: CTX_IN order is the conversation's order.
	// Without it (load, a throughput tool) turns are pipelined, and a turn
	// retried after later turns of its conversation were sent is counted
	// as Reordered, and fails the run.
	inOrder bool
}

// pubStats is what a run measured.
type pubStats struct {
	Turns, Bytes, Duplicates, Failed int
	// Reordered counts turns retried after later turns of their
	// conversation had been sent: CTX_IN may hold them out of order.
	Reordered int
	Elapsed   time.Duration
	Latencies []time.Duration // send → ack, per turn
}

func (s pubStats) summary() string {
	secs := s.Elapsed.Seconds()
	if secs == 0 {
		secs = 1e-9
	}
	line := fmt.Sprintf("published %s turns, %s in %s: %s turns/s, %.2f MB/s, %s duplicates",
		thousands(s.Turns), mb(s.Bytes), s.Elapsed.Round(time.Millisecond),
		thousands(int(float64(s.Turns)/secs)), float64(s.Bytes)/1e6/secs, thousands(s.Duplicates))
	if s.Failed > 0 {
		line += fmt.Sprintf(", %d FAILED", s.Failed)
	}
	if s.Reordered > 0 {
		line += fmt.Sprintf(", %d RETRIED AFTER LATER TURNS OF THEIR CONVERSATION", s.Reordered)
	}
	return line
}

type inflight struct {
	turn schema.Turn
	subj string
	data []byte
	sent time.Time
	fut  jetstream.PubAckFuture
	// done is closed once the turn is acked, or failed for good after its
	// retries (inOrder: the conversation's next turn is sent only then).
	done chan struct{}
	// nth is the turn's place among its conversation's turns sent.
	nth int
}

func (p *publisher) run(ctx context.Context, next source) (pubStats, error) {
	var (
		st   pubStats
		mu   sync.Mutex
		errs []error
		sent = map[string]int{} // turns sent per conversation (under mu)
	)
	start := time.Now()
	queue := make(chan inflight, window)
	done := make(chan struct{})
	go func() { // collector: acks arrive (nearly) in publish order
		defer close(done)
		for f := range queue {
			ack, retried, err := p.await(ctx, f)
			if retried {
				// Checked before done is closed: with inOrder, the next
				// turn is sent only after.
				mu.Lock()
				if sent[f.turn.ConversationID] > f.nth+1 {
					st.Reordered++
				}
				mu.Unlock()
			}
			close(f.done)
			mu.Lock()
			st.Latencies = append(st.Latencies, time.Since(f.sent))
			if err != nil {
				st.Failed++
				if len(errs) < 5 {
					errs = append(errs, err)
				}
			} else {
				st.Turns++
				st.Bytes += len(f.data)
				if ack.Duplicate {
					st.Duplicates++
				}
			}
			p.progress.update(st.Turns, st.Bytes, st.Duplicates)
			mu.Unlock()
			if err == nil && p.onAck != nil {
				p.onAck(&f.turn, f.sent)
			}
		}
	}()

	var sendErr error
	// A failed async publish is retried (await); had the conversation's
	// next turns been sent meanwhile, they would be stored before it, and a
	// tool_result stored before its call is rejected (a broker restart
	// under load makes such retries). inOrder keeps one turn per
	// conversation in flight; conversations still go in parallel.
	last := map[string]chan struct{}{}
	for i := 0; ; i++ {
		t, ok := next()
		if !ok {
			break
		}
		if p.rate > 0 {
			due := start.Add(time.Duration(float64(i) / p.rate * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				select {
				case <-time.After(d):
				case <-ctx.Done():
				}
			}
		}
		if ctx.Err() != nil {
			sendErr = ctx.Err()
			break
		}
		select {
		case <-p.denied:
			sendErr = fmt.Errorf("publish: %w", p.deniedErr())
		default:
		}
		if sendErr != nil {
			break
		}
		data, err := schema.Marshal(t)
		if err != nil {
			sendErr = fmt.Errorf("encode turn %s: %w", t.ID, err)
			break
		}
		if prev := last[t.ConversationID]; prev != nil && p.inOrder {
			select {
			case <-prev:
			case <-ctx.Done():
				sendErr = ctx.Err()
			}
			if sendErr != nil {
				break
			}
		}
		subj := schema.InputSubject(t.ConversationID, schema.KindTurn)
		fut, err := p.js.PublishAsync(subj, data, jetstream.WithMsgID(bus.MsgID(p.js.Conn(), subj, t.ID)),
			jetstream.WithExpectStream(bus.StreamIn), jetstream.WithStallWait(30*time.Second))
		if err != nil {
			sendErr = fmt.Errorf("publish %s: %w", subj, err)
			break
		}
		mu.Lock()
		f := inflight{turn: t, subj: subj, data: data, sent: time.Now(), fut: fut, done: make(chan struct{}), nth: sent[t.ConversationID]}
		sent[t.ConversationID]++
		mu.Unlock()
		last[t.ConversationID] = f.done
		queue <- f
	}
	close(queue)
	<-done
	st.Elapsed = time.Since(start)
	p.progress.finish()
	if sendErr != nil {
		return st, sendErr
	}
	if len(errs) > 0 {
		return st, fmt.Errorf("%d turns not acked: %w", st.Failed, errors.Join(errs...))
	}
	if st.Reordered > 0 {
		return st, fmt.Errorf("%d turns were stored only after later turns of their conversation (their first publish failed): those conversations may be out of order in CTX_IN", st.Reordered)
	}
	return st, nil
}

// await waits for one ack. A failed async publish is retried synchronously
// (retried): the Nats-Msg-Id makes a retry on the same connection safe
// (JetStream reports it as a duplicate if the first copy was stored after
// all), and the service applies an input id once per tenant in any case.
func (p *publisher) await(ctx context.Context, f inflight) (ack *jetstream.PubAck, retried bool, err error) {
	select {
	case ack := <-f.fut.Ok():
		return ack, false, nil
	case err = <-f.fut.Err():
	case <-ctx.Done():
		return nil, false, ctx.Err()
	case <-p.denied:
		return nil, false, fmt.Errorf("publish %s: %w", f.subj, p.deniedErr())
	}
	ack, err = p.retry(ctx, f, err)
	return ack, true, err
}

// retry publishes f again, synchronously, after its async publish failed
// with err.
func (p *publisher) retry(ctx context.Context, f inflight, err error) (*jetstream.PubAck, error) {
	for attempt := 0; attempt < 3 && ctx.Err() == nil; attempt++ {
		if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) {
			return nil, fmt.Errorf("publish %s: no stream stores %s (is ctxpipe running, or CTX_IN created?): %w", f.turn.ID, f.subj, err)
		}
		var ack *jetstream.PubAck
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		ack, err = bus.PublishInput(pctx, p.js, f.subj, f.turn.ID, f.data)
		cancel()
		if err == nil {
			return ack, nil
		}
	}
	return nil, err
}

// query sends a request and decodes the reply (into reply, unless nil); a reply {"error":…} comes
// back wrapped in errQueryFailed.
func query(ctx context.Context, nc *nats.Conn, subject string, req any, timeout time.Duration, reply any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	msg, err := nc.RequestWithContext(rctx, subject, body)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return fmt.Errorf("%s: no responders (is ctxpipe running?): %w", subject, err)
		}
		return fmt.Errorf("%s: %w", subject, err)
	}
	if err := schema.DecodeQueryReply(msg.Data, reply); err != nil {
		var qe *schema.QueryErrorBody
		if errors.As(err, &qe) {
			return fmt.Errorf("%w: %w", errQueryFailed, qe)
		}
		return err
	}
	return nil
}

// percentile returns the p-th percentile (0–100) of ds (sorted in place).
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := int(float64(len(ds)-1) * p / 100)
	return ds[i]
}
