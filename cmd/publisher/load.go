package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/schema"
)

func runLoad(ctx context.Context, c *cli, args []string) error {
	fs := c.flags()
	convs := fs.Int("convs", 10, "conversations (concurrent agents)")
	turns := fs.Int("turns", 100, "turns per conversation")
	sizeFlag := fs.String("size", string(SizeRealistic), "turn sizes: realistic, small or large")
	seed := fs.Int64("seed", 0, "random seed; the same seed gives the same turns and ids (default: from the clock)")
	profile := fs.String("profile", "", "profile id for every turn")
	rate := fs.Float64("rate", 0, "turns per second across all conversations (0 = as fast as acks allow)")
	wait := fs.Bool("wait", false, "measure end to end: until each conversation's last turn is readable via ctx.q.history")
	waitTimeout := fs.Duration("wait-timeout", 10*time.Minute, "how long --wait waits in total")
	sample := fs.Int("sample", 0, "with --wait, also time publish → readable for every Nth turn (0: only each conversation's last)")
	agent := fs.Bool("agent", false, "the agent workload: each conversation publishes a turn, reads its effective history holding it, then publishes the next; times publish → readable for every turn")
	fullReads := fs.Bool("full-reads", false, "with --agent, read the whole effective history every time instead of only what was appended since the last read")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *convs < 1 || *turns < 1 {
		return usagef("--convs and --turns must be at least 1")
	}
	size, err := ParseSize(*sizeFlag)
	if err != nil {
		return usageError{err.Error()}
	}
	if *seed == 0 {
		*seed = time.Now().UnixNano()
	}
	w := newWorkload(*seed, *convs, *turns, size, *profile, time.Now().UnixMilli())

	nc, js, err := c.connect(jetstream.WithPublishAsyncMaxPending(window))
	if err != nil {
		return err
	}
	defer nc.Close()
	fmt.Fprintf(c.stderr, "load: %d conversations × %d turns, size %s, seed %d\n", *convs, *turns, size, *seed)
	if *agent {
		return runAgents(ctx, c, nc, js, w, *rate, !*fullReads, *waitTimeout)
	}

	var waiter *e2eWaiter
	p := &publisher{js: js, rate: *rate, progress: newProgress(c.stderr, "published", *convs**turns),
		denied: c.denied, deniedErr: c.permission}
	if *wait {
		waiter = newE2EWaiter(ctx, nc, *waitTimeout)
		var acked atomic.Int64
		p.onAck = func(t *schema.Turn, sent time.Time) {
			n := acked.Add(1)
			switch {
			case w.isLast(t):
				waiter.start(t.ConversationID, t.ID, sent, true)
			case *sample > 0 && n%int64(*sample) == 0:
				waiter.start(t.ConversationID, t.ID, sent, false)
			}
		}
	}
	st, err := p.run(ctx, w.source(c.stderr, *rate))
	fmt.Fprintln(c.stderr, st.summary())
	fmt.Fprintf(c.stderr, "publish ack latency p50 %s p99 %s\n",
		percentile(st.Latencies, 50).Round(time.Microsecond), percentile(st.Latencies, 99).Round(time.Microsecond))
	if err != nil {
		return err
	}
	if waiter == nil {
		return nil
	}
	res := waiter.wait()
	total := st.Turns
	secs := max(res.end.Sub(res.begin).Seconds(), 1e-9)
	fmt.Fprintf(c.stderr, "end to end: %d/%d conversations readable, last-turn latency p50 %s p99 %s, %s turns/s end to end (%s)\n",
		len(res.latencies), *convs, percentile(res.latencies, 50).Round(time.Millisecond),
		percentile(res.latencies, 99).Round(time.Millisecond), thousands(int(float64(total)/secs)),
		res.end.Sub(res.begin).Round(time.Millisecond))
	if len(res.samples) > 0 {
		fmt.Fprintf(c.stderr, "sampled turns: %d, publish → readable p50 %s p99 %s\n", len(res.samples),
			percentile(res.samples, 50).Round(time.Millisecond), percentile(res.samples, 99).Round(time.Millisecond))
	}
	if len(res.errs) > 0 {
		return fmt.Errorf("%d conversations not readable: %w", len(res.errs), errors.Join(res.errs[:min(len(res.errs), 5)]...))
	}
	return nil
}

// workload interleaves the turns of many conversations as concurrent agents
// would: each step picks a random conversation that still has turns and
// takes its next one, so each conversation stays in order.
type workload struct {
	rng     *rand.Rand
	gens    []*generator
	convs   []string
	left    []int
	active  []int // indexes of conversations with turns left
	turns   int
	profile string
	lastID  sync.Map // conv → id of its last turn
}

func convName(seed int64, i int) string { return fmt.Sprintf("load-%08x-%04d", uint32(seed), i) }

func newWorkload(seed int64, convs, turns int, size Size, profile string, now int64) *workload {
	w := &workload{rng: rand.New(rand.NewPCG(uint64(seed), 0x6c6f6164)), turns: turns, profile: profile}
	for i := range convs {
		name := convName(seed, i)
		// Agents started within the last minute.
		w.gens = append(w.gens, newGenerator(seed, name, size, now-60_000))
		w.convs = append(w.convs, name)
		w.left = append(w.left, turns)
		w.active = append(w.active, i)
	}
	return w
}

func (w *workload) next() (schema.Turn, bool) {
	if len(w.active) == 0 {
		return schema.Turn{}, false
	}
	k := w.rng.IntN(len(w.active))
	i := w.active[k]
	w.left[i]--
	last := w.left[i] == 0
	t := w.gens[i].next(last)
	if w.profile != "" {
		t.ProfileID = w.profile
	}
	if last {
		w.lastID.Store(t.ConversationID, t.ID)
		w.active[k] = w.active[len(w.active)-1]
		w.active = w.active[:len(w.active)-1]
	}
	return t, true
}

// pregenerateMax and pregenerateBytes bound the turns the load generates
// before it starts the clock: the rest are generated on the way.
const (
	pregenerateMax   = 100_000
	pregenerateBytes = 128 << 20
)

// source is where the load's turns come from. As fast as acks allow (rate
// 0), turns are generated before the clock starts, as many as the bounds
// above let: generating them costs CPU that, on a machine shared with the
// service, would be taken from what is measured (operations.md, section 7).
func (w *workload) source(stderr io.Writer, rate float64) source {
	return w.sourceWithin(stderr, rate, pregenerateBytes)
}

// sourceWithin is source with a bound of its own on the content generated
// first.
func (w *workload) sourceWithin(stderr io.Writer, rate float64, maxBytes int) source {
	if rate > 0 {
		return w.next
	}
	start := time.Now()
	var turns []schema.Turn
	size := 0
	for len(turns) < pregenerateMax && size < maxBytes {
		t, ok := w.next()
		if !ok {
			break
		}
		turns = append(turns, t)
		size += contentBytes(t.Content)
	}
	fmt.Fprintf(stderr, "load: %d turns (%s of content) generated in %s, before the clock starts\n",
		len(turns), mb(size), time.Since(start).Round(time.Millisecond))
	first := sliceSource(turns)
	return func() (schema.Turn, bool) {
		if t, ok := first(); ok {
			return t, true
		}
		return w.next()
	}
}

// contentBytes is about what a content weighs: its texts and tool inputs.
func contentBytes(c schema.Content) int {
	n := 0
	for _, b := range c.BlocksOf() {
		n += len(b.Text) + len(b.Input)
		if b.Content != nil {
			n += contentBytes(*b.Content)
		}
	}
	return n
}

func (w *workload) isLast(t *schema.Turn) bool {
	id, ok := w.lastID.Load(t.ConversationID)
	return ok && id == t.ID
}

// e2eWaiter asks ctx.q.history with wait_for for each conversation's last
// turn as soon as it is acked, and records publish → readable.
type e2eWaiter struct {
	ctx      context.Context
	nc       *nats.Conn
	deadline time.Time
	begin    time.Time
	wg       sync.WaitGroup
	mu       sync.Mutex
	res      e2eResult
	// seqs holds each conversation's highest history seq seen, so that
	// every wait reads only what was appended since (any earlier seq is
	// as good: the reply is then just longer).
	seqs sync.Map
}

// ready waits until input id of conv is readable, reading incrementally.
func (e *e2eWaiter) ready(conv, id string, timeout time.Duration) error {
	var after int64
	if v, ok := e.seqs.Load(conv); ok {
		after = v.(int64)
	}
	req := schema.HistoryRequest{ConversationID: conv, View: schema.ViewEffective, WaitFor: id,
		TimeoutMS: min(timeout, schema.MaxQueryTimeout).Milliseconds(), After: after}
	var reply struct {
		Seq int64 `json:"seq"`
	}
	if err := query(e.ctx, e.nc, schema.SubjectHistory, req, timeout+5*time.Second, &reply); err != nil {
		return err
	}
	for {
		v, loaded := e.seqs.LoadOrStore(conv, reply.Seq)
		if !loaded || v.(int64) >= reply.Seq || e.seqs.CompareAndSwap(conv, v, reply.Seq) {
			return nil
		}
	}
}

type e2eResult struct {
	begin, end time.Time
	latencies  []time.Duration // each conversation's last turn
	samples    []time.Duration // every Nth turn (--sample)
	errs       []error
}

func newE2EWaiter(ctx context.Context, nc *nats.Conn, timeout time.Duration) *e2eWaiter {
	now := time.Now()
	return &e2eWaiter{ctx: ctx, nc: nc, deadline: now.Add(timeout), begin: now}
}

func (e *e2eWaiter) start(conv, id string, sent time.Time, last bool) {
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		var err error
		for {
			left := time.Until(e.deadline)
			if left <= 0 {
				err = fmt.Errorf("%s: not readable in time", conv)
				break
			}
			err = e.ready(conv, id, min(left, schema.MaxQueryTimeout))
			// timeout and not_found mean "not applied yet": the service is
			// behind, so ask again until our own deadline.
			var qe *schema.QueryErrorBody
			if err == nil || !errors.As(err, &qe) || e.ctx.Err() != nil {
				break
			}
			if qe.Code != schema.QueryTimeout && qe.Code != schema.QueryNotFound {
				break
			}
			if qe.Code == schema.QueryNotFound {
				select {
				case <-time.After(200 * time.Millisecond):
				case <-e.ctx.Done():
				}
			}
		}
		now := time.Now()
		e.mu.Lock()
		defer e.mu.Unlock()
		if err != nil {
			e.res.errs = append(e.res.errs, err)
			return
		}
		if !last {
			e.res.samples = append(e.res.samples, now.Sub(sent))
			return
		}
		e.res.latencies = append(e.res.latencies, now.Sub(sent))
		if now.After(e.res.end) {
			e.res.end = now
		}
	}()
}

func (e *e2eWaiter) wait() e2eResult {
	e.wg.Wait()
	e.mu.Lock()
	defer e.mu.Unlock()
	e.res.begin = e.begin
	if e.res.end.IsZero() {
		e.res.end = time.Now()
	}
	return e.res
}

// agentResult is what one agent of the agent workload measured.
type agentResult struct {
	latencies []time.Duration // publish → readable, every turn
	// resetLatencies are those of the reads that came back reset: turns
	// whose own commit condensed or truncated, which waited for that.
	resetLatencies []time.Duration
	replyBytes     int64
	reads          int
	resets         int
	err            error
}

// runAgents runs the agent workload: every conversation is an agent that
// publishes a turn, waits for its ack, reads its effective history holding
// that turn (wait_for) and only then publishes its next turn, as agents do
// before calling their model. With incremental reads each read asks for
// what was appended after the previous reply's seq, and the agent keeps the
// history it holds up to date from it. rate paces all agents together (0:
// as fast as each read comes back).
func runAgents(ctx context.Context, c *cli, nc *nats.Conn, js jetstream.JetStream, w *workload, rate float64, incremental bool, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	results := make([]agentResult, len(w.gens))
	var interval time.Duration
	if rate > 0 {
		interval = time.Duration(float64(len(w.gens)) / rate * float64(time.Second))
	}
	begin := time.Now()
	var wg sync.WaitGroup
	for i, g := range w.gens {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := &results[i]
			var (
				seq  int64
				held int
			)
			next := time.Now().Add(time.Duration(rand.Int64N(int64(max(interval, time.Millisecond)))))
			for n := range w.turns {
				if interval > 0 {
					time.Sleep(time.Until(next))
					next = next.Add(interval)
				}
				t := g.next(n == w.turns-1)
				if w.profile != "" {
					t.ProfileID = w.profile
				}
				data, err := schema.Marshal(t)
				if err != nil {
					res.err = err
					return
				}
				sent := time.Now()
				if _, err := bus.PublishInput(ctx, js, schema.InputSubject(t.ConversationID, schema.KindTurn), t.ID, data); err != nil {
					res.err = fmt.Errorf("%s: publish: %w", t.ConversationID, err)
					return
				}
				req := schema.HistoryRequest{ConversationID: t.ConversationID, View: schema.ViewEffective, WaitFor: t.ID,
					TimeoutMS: schema.MaxQueryTimeout.Milliseconds()}
				if incremental {
					req.After = seq
				}
				body, _ := json.Marshal(req)
				msg, err := nc.RequestWithContext(ctx, schema.SubjectHistory, body)
				if err != nil {
					res.err = fmt.Errorf("%s: history: %w", t.ConversationID, err)
					return
				}
				var reply schema.HistoryReply
				if err := schema.DecodeQueryReply(msg.Data, &reply); err != nil {
					res.err = fmt.Errorf("%s: history: %w", t.ConversationID, err)
					return
				}
				took := time.Since(sent)
				res.latencies = append(res.latencies, took)
				res.replyBytes += int64(len(msg.Data))
				res.reads++
				switch {
				case !incremental || reply.Reset || seq == 0:
					held = len(reply.Messages)
					if reply.Reset {
						res.resets++
						res.resetLatencies = append(res.resetLatencies, took)
					}
				default:
					held += len(reply.Messages)
				}
				if len(reply.Messages) == 0 || held == 0 {
					res.err = fmt.Errorf("%s: the history read after turn %s holds nothing new", t.ConversationID, t.ID)
					return
				}
				seq = reply.Seq
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(begin)
	var (
		all, resets  []time.Duration
		bytes        int64
		reads, reset int
		errs         []error
	)
	for _, r := range results {
		all = append(all, r.latencies...)
		resets = append(resets, r.resetLatencies...)
		bytes += r.replyBytes
		reads += r.reads
		reset += r.resets
		if r.err != nil {
			errs = append(errs, r.err)
		}
	}
	mode := "incremental"
	if !incremental {
		mode = "full"
	}
	fmt.Fprintf(c.stderr, "agents: %d turns in %s, %s turns/s; publish → readable p50 %s p99 %s; %s reads, %s bytes per read (%d resets)\n",
		len(all), elapsed.Round(time.Millisecond), thousands(int(float64(len(all))/max(elapsed.Seconds(), 1e-9))),
		percentile(all, 50).Round(10*time.Microsecond), percentile(all, 99).Round(10*time.Microsecond),
		mode, thousands(int(bytes/int64(max(reads, 1)))), reset)
	if len(resets) > 0 {
		// The reads after a condense or truncation wait for it: at low
		// rates they alone make the p99.
		fmt.Fprintf(c.stderr, "agents: the %d reset reads took p50 %s, max %s\n", len(resets),
			percentile(resets, 50).Round(10*time.Microsecond), percentile(resets, 100).Round(10*time.Microsecond))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%d agents failed: %w", len(errs), errors.Join(errs[:min(len(errs), 5)]...))
	}
	return nil
}
