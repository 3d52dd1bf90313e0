package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	openai "github.com/sashabaranov/go-openai"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/condense"
	"github.com/ctxpipe/ctxpipe/internal/natstest"
	"github.com/ctxpipe/ctxpipe/internal/openaitest"
	"github.com/ctxpipe/ctxpipe/internal/transcripts"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/store"
)

// The scale-out test's shape: its conversations belong to a tenant, so
// CTX_IN's transform partitions them (ctx.in.<p>.acme.<conv>.turn), over
// few partitions, which keeps the cluster's consumer placement quick.
const (
	scaleTenant     = "acme"
	scalePartitions = 8
	// scaleProbes conversations are spread by the server's hash over the
	// partitions; 40 leave none of 8 without one.
	scaleProbes = 40
	// failoverLimit is not the goal (5 s): past it, failover is broken,
	// not slow.
	failoverLimit = 15 * time.Second
	// scalePerConv bounds each transcript: 12 of them make the load.
	scalePerConv = 80
	// scaleBurst turns are published at once before each kill.
	scaleBurst = 120
)

// scaleInst is one consumer instance: a name, a data dir and the child
// process running on them (restarted on the same ones).
type scaleInst struct {
	name, dataDir string
	http          string
	log           string
	p             *proc
	runs          int
	files         int // --store-files
}

func (in *scaleInst) db() string     { return filepath.Join(in.dataDir, "ctxpipe.db") }
func (in *scaleInst) alive() bool    { return in.p != nil && !in.p.exit }
func (in *scaleInst) String() string { return in.name }

// scaleRig is a 3-node cluster, the consumer instances on it, and the
// record of every turn published, per conversation key in publish order.
type scaleRig struct {
	t        *testing.T
	ctx      context.Context
	deadline time.Time
	bin, dir string
	env      []string
	args     []string // every instance's, before its own
	cl       *natstest.Cluster
	c        *client
	insts    []*scaleInst
	rng      *rand.Rand // the test goroutine's only

	mu     sync.Mutex
	byConv map[string][]schema.Turn
	order  []schema.Turn
}

// scaleKey is the conversation key of the test tenant's conversation conv.
func scaleKey(conv string) string { return schema.ConversationKey(scaleTenant, conv) }

// publish publishes tn on the tenant's subject (PublishInput retries while
// the stream elects a leader) and records it.
func (r *scaleRig) publish(tn schema.Turn) error {
	data, err := schema.Marshal(tn)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(r.ctx, time.Minute)
	defer cancel()
	if _, err := bus.PublishInput(ctx, r.c.js, schema.InputSubject(scaleKey(tn.ConversationID), schema.KindTurn), tn.ID, data); err != nil {
		return err
	}
	r.mu.Lock()
	key := scaleKey(tn.ConversationID)
	r.byConv[key] = append(r.byConv[key], tn)
	r.order = append(r.order, tn)
	r.mu.Unlock()
	return nil
}

// awaitApplied waits until a history query (answered by whichever instance
// the queue group picks) has turn tn, retrying through lost requests.
func awaitApplied(ctx context.Context, c *client, tn schema.Turn, limit time.Duration) error {
	until := time.Now().Add(limit)
	for {
		wait := max(min(time.Until(until), 10*time.Second), 100*time.Millisecond)
		var rep schema.HistoryReply
		req := schema.HistoryRequest{ConversationID: tn.ConversationID, View: schema.ViewFull, WaitFor: tn.ID, TimeoutMS: wait.Milliseconds()}
		err := c.query(schema.QuerySubject(scaleTenant, schema.VerbHistory), req, &rep, wait+3*time.Second)
		switch {
		case err == nil:
			return nil
		case isQueryCode(err, schema.QueryInputRejected):
			return fmt.Errorf("input %s of %s rejected: %w", tn.ID, tn.ConversationID, err)
		case time.Now().After(until) || ctx.Err() != nil:
			return fmt.Errorf("input %s of %s not applied after %v: %w", tn.ID, tn.ConversationID, limit, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (r *scaleRig) start(in *scaleInst) {
	r.t.Helper()
	in.runs++
	in.http = freeAddr(r.t)
	in.log = filepath.Join(r.dir, fmt.Sprintf("%s-run%d.log", in.name, in.runs))
	args := append(slices.Clone(r.args), "--data-dir", in.dataDir, "--name", in.name, "--http", in.http)
	in.p = startConsumer(r.t, r.bin, in.log, r.env, args...)
}

// waitReady polls the instance's own /readyz (a query would be answered by
// whichever instance is up).
func (r *scaleRig) waitReady(in *scaleInst) {
	r.t.Helper()
	hc := &http.Client{Timeout: 2 * time.Second}
	for {
		resp, err := hc.Get("http://" + in.http + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case err := <-in.p.done:
			in.p.err, in.p.exit = err, true
			r.t.Fatalf("%s exited before it was ready: %v", in, err)
		default:
		}
		if time.Now().After(r.deadline) {
			r.t.Fatalf("%s not ready", in)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// kill sends SIGKILL and returns when it was sent.
func (r *scaleRig) kill(in *scaleInst) time.Time {
	r.t.Helper()
	t0 := time.Now()
	if err := in.p.cmd.Process.Kill(); err != nil {
		r.t.Fatal(err)
	}
	if err := in.p.wait(); err == nil {
		r.t.Fatalf("%s exited cleanly after SIGKILL", in)
	}
	return t0
}

// stop stops the instance with SIGINT, which flushes its outbox.
func (r *scaleRig) stop(in *scaleInst) {
	r.t.Helper()
	if err := in.p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		r.t.Fatal(err)
	}
	if err := in.p.wait(); err != nil {
		r.t.Fatalf("graceful stop of %s: %v", in, err)
	}
}

// scrape returns the instance's /metrics ("" when it does not answer).
func (r *scaleRig) scrape(in *scaleInst) string {
	hc := &http.Client{Timeout: 2 * time.Second}
	resp, err := hc.Get("http://" + in.http + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return ""
	}
	return string(b)
}

// gauge reads one sample of the instance's /metrics; ok is false when the
// series is absent.
func (r *scaleRig) gauge(in *scaleInst, series string) (float64, bool) {
	s := r.scrape(in)
	if !strings.Contains("\n"+s, "\n"+series+" ") {
		return 0, false
	}
	return metricValue(r.t, s, series), true
}

// scaleNotable picks the log lines printed on failure besides the tails.
var scaleNotable = regexp.MustCompile(`level=ERROR|msg="input rejected"|cannot be applied|not found in conversation`)

// ownerLine is a child's log line about taking or handing over a partition.
var ownerLine = regexp.MustCompile(`^time=(\S+) .*msg="(partition taken|handing partition over)" partition=(\d+)`)

// owners reads the live instances' logs: for each partition, the instance
// whose log last says it took it, unless it handed it over since.
func (r *scaleRig) owners() map[int]*scaleInst {
	type mark struct {
		at   time.Time
		in   *scaleInst
		take bool
	}
	last := map[int]mark{}
	for _, in := range r.insts {
		if !in.alive() {
			continue
		}
		for _, m := range logMatches(in.log, ownerLine) {
			at, err := time.Parse(time.RFC3339Nano, m[1])
			if err != nil {
				continue
			}
			p, _ := strconv.Atoi(m[3])
			if e, ok := last[p]; !ok || !at.Before(e.at) {
				last[p] = mark{at, in, m[2] == "partition taken"}
			}
		}
	}
	out := map[int]*scaleInst{}
	for p, e := range last {
		if e.take {
			out[p] = e.in
		}
	}
	return out
}

// logMatches returns re's matches on the complete lines of a child's log.
func logMatches(path string, re *regexp.Regexp) [][]string {
	b, _ := os.ReadFile(path)
	s := string(b)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	var out [][]string
	for _, line := range strings.Split(s, "\n") {
		if m := re.FindStringSubmatch(line); m != nil {
			out = append(out, m)
		}
	}
	return out
}

func partsOf(owners map[int]*scaleInst, in *scaleInst) []int {
	var ps []int
	for p, o := range owners {
		if o == in {
			ps = append(ps, p)
		}
	}
	sort.Ints(ps)
	return ps
}

// pickVictim is the live instance owning the most partitions: by its
// ctxpipe_partitions_owned gauge when it has one, else by its log. It
// returns the partitions its log says it owns (the ones to probe).
func (r *scaleRig) pickVictim() (*scaleInst, []int) {
	r.t.Helper()
	owners := r.owners()
	var victim *scaleInst
	best := -1.0
	var report []string
	for _, in := range r.insts {
		if !in.alive() {
			continue
		}
		ps := partsOf(owners, in)
		n, ok := r.gauge(in, "ctxpipe_partitions_owned")
		if !ok {
			n = float64(len(ps))
		}
		report = append(report, fmt.Sprintf("%s: gauge %v (present %v), log %v", in, n, ok, ps))
		if n > best {
			victim, best = in, n
		}
	}
	r.t.Logf("ownership: %s", strings.Join(report, "; "))
	return victim, partsOf(owners, victim)
}

// probeFailover publishes a probe turn to a conversation of each partition
// in parts and returns how long after t0 each was applied.
func (r *scaleRig) probeFailover(t0 time.Time, probeConv map[int]string, parts []int) map[int]time.Duration {
	r.t.Helper()
	type probe struct {
		p  int
		tn schema.Turn
	}
	var probes []probe
	for _, p := range parts {
		conv, ok := probeConv[p]
		if !ok {
			continue
		}
		r.mu.Lock()
		i := len(r.byConv[scaleKey(conv)])
		r.mu.Unlock()
		tn := textTurn(r.rng, conv, crashProfile, i, time.Now().UnixMilli(), 30)
		if err := r.publish(tn); err != nil {
			r.t.Fatal(err)
		}
		probes = append(probes, probe{p, tn})
	}
	out := map[int]time.Duration{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, len(probes))
	for _, pr := range probes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := awaitApplied(r.ctx, r.c, pr.tn, time.Minute); err != nil {
				errs <- fmt.Errorf("probe of partition %d: %w", pr.p, err)
				return
			}
			mu.Lock()
			out[pr.p] = time.Since(t0)
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		r.t.Fatal(err)
	}
	return out
}

// spread returns the first and last of the durations, and all of them
// by partition for the log.
func spread(d map[int]time.Duration) (first, last time.Duration, all string) {
	var ps []int
	for p := range d {
		ps = append(ps, p)
	}
	sort.Ints(ps)
	var parts []string
	for i, p := range ps {
		v := d[p]
		if i == 0 || v < first {
			first = v
		}
		last = max(last, v)
		parts = append(parts, fmt.Sprintf("p%d %v", p, v.Round(time.Millisecond)))
	}
	return first, last, strings.Join(parts, ", ")
}

// takenSince reports the live instances' "partition taken" lines after t0.
func (r *scaleRig) takenSince(t0 time.Time) []string {
	return r.linesSince(t0, regexp.MustCompile(`^time=(\S+) .*msg="partition taken" (partition=\d+ .*)$`))
}

// linesSince reports the live instances' log lines re matches after t0
// (re's first group the time, its second what is reported).
func (r *scaleRig) linesSince(t0 time.Time, re *regexp.Regexp) []string {
	var out []string
	for _, in := range r.insts {
		if !in.alive() {
			continue
		}
		for _, m := range logMatches(in.log, re) {
			if at, err := time.Parse(time.RFC3339Nano, m[1]); err == nil && at.After(t0) {
				out = append(out, in.name+": "+m[2])
			}
		}
	}
	return out
}

// scaleLoad is conversations from the real transcripts: n runs of at most
// perConv turns each, renamed so-00.., with fresh ids and the crash profile,
// interleaved round-robin so that every conversation is in flight at once.
func scaleLoad(t *testing.T, n, perConv int) []schema.Turn {
	t.Helper()
	var runs [][]schema.Turn
	for _, f := range transcripts.Files(t, "../../../shared/data/transcripts") {
		lines := transcripts.Read(t, f)
		if len(lines) < 100 {
			continue
		}
		conv := fmt.Sprintf("so-%02d", len(runs))
		var turns []schema.Turn
		for i, l := range lines[:min(len(lines), perConv)] {
			tn := l.Turn
			tn.ID = uuid.NewSHA1(uuid.NameSpaceURL, []byte("ctxpipe-scaleout/"+conv+"/"+strconv.Itoa(i))).String()
			tn.ConversationID, tn.ProfileID = conv, crashProfile
			turns = append(turns, tn)
		}
		runs = append(runs, turns)
		if len(runs) == n {
			break
		}
	}
	if len(runs) < n {
		t.Fatalf("%d transcripts of 100 turns or more, want %d", len(runs), n)
	}
	var out []schema.Turn
	for i := 0; i < perConv; i++ {
		for _, turns := range runs {
			if i < len(turns) {
				out = append(out, turns[i])
			}
		}
	}
	return out
}

// TestScaleOutFailover is the failover test. It runs 3 consumer
// instances (the real binary) on a 3-node cluster at R3 with CTX_IN in 8
// partitions, feeds them 12 real transcripts of one tenant (condensing
// through a summarizer that takes 50 ms), and while the load flows
// SIGKILLs the instance owning the most partitions, then kills a NATS node
// (the leader of CTX_STATE), then SIGKILLs the next instance owning the
// most; a burst of turns comes just before each loss. After each loss it
// reports how long after it a fresh probe turn to each partition the lost
// one owned was applied by a survivor (the failover time; goal < 5 s, the
// test fails only past 15 s). At the end the killed instances and the node
// are back, and every instance's SQLite must hold every input once, in
// order, in the file of each instance holding its partition (owner and
// standbys), CTX_EVENTS every event once, and each conversation's history
// and events in every such file must equal those of one instance consuming
// the same inputs alone. It runs with --standby 1 (the next owner follows
// the partition already) and --standby 0 (the next owner restores the
// partition from the changelog when it takes it over: the restore times are
// reported).
func TestScaleOutFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a 3-node cluster and three service binaries")
	}
	for _, standby := range []int{1, 0} {
		t.Run("standby="+strconv.Itoa(standby), func(t *testing.T) { testScaleOutFailover(t, standby) })
	}
}

// restoredLine is a child's log line about a partition restored.
var restoredLine = regexp.MustCompile(`^time=(\S+) .*msg="partition restored" (partition=\d+ .*)$`)

func testScaleOutFailover(t *testing.T, standby int) {
	began := time.Now()
	deadline := began.Add(4 * time.Minute)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	t.Cleanup(cancel)
	r := &scaleRig{t: t, ctx: ctx, deadline: deadline, bin: buildConsumer(t), dir: t.TempDir(),
		byConv: map[string][]schema.Turn{}, rng: rand.New(rand.NewPCG(10, 10))}
	// On failure, besides each log's tail (startConsumer), what the
	// instances said about rejections and the changelog; with
	// SCALEOUT_KEEP_DIR set, the logs and SQLite files are copied there.
	// slow is set by an instance kill past the 5 s goal, or a node loss
	// past 15 s: their logs are kept as well.
	slow := false
	t.Cleanup(func() {
		if keep := os.Getenv("SCALEOUT_KEEP_DIR"); keep != "" && (t.Failed() || slow) {
			keep = filepath.Join(keep, strings.ReplaceAll(t.Name(), "/", "_")+"-"+time.Now().Format("150405"))
			_ = os.MkdirAll(keep, 0o755)
			logs, _ := filepath.Glob(filepath.Join(r.dir, "*.log"))
			dbs, _ := filepath.Glob(filepath.Join(r.dir, "*", "ctxpipe*.db*"))
			for _, l := range append(logs, dbs...) {
				b, _ := os.ReadFile(l)
				_ = os.WriteFile(filepath.Join(keep, strings.ReplaceAll(strings.TrimPrefix(l, r.dir+"/"), "/", "_")), b, 0o644)
			}
			t.Logf("logs and SQLite files kept in %s", keep)
		}
		if !t.Failed() {
			return
		}
		logs, _ := filepath.Glob(filepath.Join(r.dir, "*.log"))
		for _, l := range logs {
			var keep []string
			for _, m := range logMatches(l, scaleNotable) {
				keep = append(keep, m[0])
			}
			if len(keep) > 0 {
				t.Logf("%s, errors and rejections (%d lines):\n%s", filepath.Base(l), len(keep), strings.Join(keep[:min(len(keep), 40)], "\n"))
			}
		}
	})

	// Condenses go through a summarizer that takes 50 ms, as in the crash
	// tests: instances are mid-condense when they are killed.
	ai := openaitest.New(t)
	ai.SetHandler(func(req openai.ChatCompletionRequest) openaitest.Reply {
		rep := openaitest.DefaultReply(req)
		rep.Delay = 50 * time.Millisecond
		return rep
	})
	r.env = []string{condense.EnvBaseURL + "=" + ai.URL(), condense.EnvModel + "=slow-test-model"}
	profiles := filepath.Join(r.dir, "profiles.json")
	if err := os.WriteFile(profiles, []byte(`[{"id":"crash","context_window":6000,"max_tokens":600,
		"condense_threshold":50,"strategy":"keep_tail"}]`), 0o644); err != nil {
		t.Fatal(err)
	}

	r.cl = natstest.RunCluster(t)
	t.Logf("cluster up in %v", time.Since(began).Round(time.Millisecond))
	r.c = connect(t, r.cl.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	// Retried with a timeout per attempt: a JetStream request the young
	// cluster loses would otherwise wait for the test's deadline.
	if err := bus.RetryStart(ctx, testLogger(t), "ensure streams", func(ctx context.Context) error {
		return bus.EnsureStreams(ctx, r.c.js, bus.WithReplicas(3), bus.WithPartitions(scalePartitions))
	}); err != nil {
		t.Fatal(err)
	}
	// An input whose delivery a node loss swallows comes back after the
	// ack wait: 10 s instead of 30 keeps the test short. Failover itself
	// is bounded by the pinned TTL (default 3 s), not by it.
	r.args = []string{"--nats-url", r.cl.URL(), "--profiles", profiles, "--partitions", strconv.Itoa(scalePartitions),
		"--replicas", "3", "--ack-wait", "10s", "--log-level", "info", "--standby", strconv.Itoa(standby)}
	// SCALEOUT_STORE_FILES runs the instances with their state split over
	// that many files (--store-files), each with its own committer.
	files := 1
	if f := os.Getenv("SCALEOUT_STORE_FILES"); f != "" {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			t.Fatalf("SCALEOUT_STORE_FILES=%q: want a count of files", f)
		}
		files = n
		r.args = append(r.args, "--store-files", f)
	}
	for i := 1; i <= 3; i++ {
		r.insts = append(r.insts, &scaleInst{name: fmt.Sprintf("inst-%d", i), dataDir: filepath.Join(r.dir, fmt.Sprintf("data-%d", i)), files: files})
	}
	// inst-1 first: it pulls first and is pinned everywhere, until the
	// others are up and it hands partitions over (if it does).
	r.start(r.insts[0])
	r.waitReady(r.insts[0])
	t.Logf("inst-1 ready %v after the start", time.Since(began).Round(time.Millisecond))
	r.start(r.insts[1])
	r.start(r.insts[2])
	r.waitReady(r.insts[1])
	r.waitReady(r.insts[2])
	t.Logf("cluster and 3 instances up in %v", time.Since(began).Round(time.Millisecond))

	// Probe conversations, one turn each, and the partition the server put
	// each in (the third token of its stored subject).
	var warm []schema.Turn
	for i := range scaleProbes {
		tn := textTurn(r.rng, fmt.Sprintf("probe-%02d", i), crashProfile, 0, time.Now().UnixMilli(), 30)
		if err := r.publish(tn); err != nil {
			t.Fatal(err)
		}
		warm = append(warm, tn)
	}
	probeConv := map[int]string{}
	for _, tn := range warm {
		if err := awaitApplied(ctx, r.c, tn, time.Minute); err != nil {
			t.Fatal(err)
		}
		var msg *jetstream.RawStreamMsg
		err := bus.RetryStart(ctx, testLogger(t), "read CTX_IN", func(ctx context.Context) error {
			in, err := r.c.js.Stream(ctx, bus.StreamIn)
			if err == nil {
				msg, err = in.GetLastMsgForSubject(ctx, "ctx.in.*."+scaleKey(tn.ConversationID)+".turn")
			}
			return err
		})
		if err != nil {
			t.Fatalf("stored subject of %s: %v", tn.ConversationID, err)
		}
		p, published, ok := bus.SplitInputSubject(msg.Subject, scalePartitions)
		if !ok || p >= scalePartitions || published != schema.InputSubject(scaleKey(tn.ConversationID), schema.KindTurn) {
			t.Fatalf("%s stored as %s: not partitioned", tn.ConversationID, msg.Subject)
		}
		if _, ok := probeConv[p]; !ok {
			probeConv[p] = tn.ConversationID
		}
	}
	allParts := make([]int, 0, scalePartitions)
	for p := range scalePartitions {
		allParts = append(allParts, p)
	}
	t.Logf("probe conversations cover %d of %d partitions", len(probeConv), scalePartitions)

	// The load, published in the background at under 40 turns/s, with a
	// burst of scaleBurst turns (as fast as the cluster takes them) just
	// before each kill, so that the victim holds inputs it has not applied
	// and deliveries are in flight; after the last kill, the rest as fast
	// as the cluster takes it.
	load := scaleLoad(t, 12, scalePerConv)
	hurry := make(chan struct{})
	bursts := make(chan chan struct{})
	loaded := make(chan error, 1)
	loaderDone := make(chan struct{})
	var sent atomic.Int64
	go func() {
		defer close(loaderDone)
		// A pause after each turn, not a schedule: after a stall (no
		// stream leader) the load goes on at the same pace.
		interval := 25 * time.Millisecond
		var burst chan struct{}
		burstLeft := 0
		for _, tn := range load {
			select {
			case <-hurry:
				interval = 0
			case burst = <-bursts:
				burstLeft = scaleBurst
			default:
			}
			if burstLeft == 0 {
				time.Sleep(interval)
			}
			if err := r.publish(tn); err != nil {
				loaded <- err
				return
			}
			sent.Add(1)
			if burstLeft > 0 {
				if burstLeft--; burstLeft == 0 {
					close(burst)
				}
			}
		}
		if burstLeft > 0 {
			close(burst)
		}
		loaded <- nil
	}()
	hurried := false
	defer func() {
		if !hurried {
			close(hurry)
		}
	}()
	// burstNow has the loader publish a burst and waits until it is out.
	burstNow := func() {
		done := make(chan struct{})
		select {
		case bursts <- done:
			select {
			case <-done:
			case <-loaderDone:
			}
		case <-loaderDone:
		}
	}

	// Let ownership settle (instances hand partitions over to the one each
	// prefers) while the load flows: every partition owned, and no change
	// for 2 s.
	settled, stable := time.Now(), ""
	for limit := time.Now().Add(10 * time.Second); time.Now().Before(limit); time.Sleep(250 * time.Millisecond) {
		owners := r.owners()
		now := fmt.Sprint(owners)
		if now != stable {
			settled, stable = time.Now(), now
		}
		if len(owners) >= scalePartitions && time.Since(settled) >= 2*time.Second {
			break
		}
	}
	t.Logf("ownership settled %v after the start", time.Since(began).Round(time.Millisecond))

	type kill struct {
		what         string
		first, last  time.Duration
		parts        int
		sentAtKill   int64
		takenLog     []string
		perPartition string
	}
	var kills []kill
	loseInstance := func(label string) {
		t.Helper()
		burstNow()
		victim, parts := r.pickVictim()
		probed := parts
		if len(probed) == 0 {
			// Its log names none (it took none yet): every partition.
			probed = allParts
		}
		k := kill{what: fmt.Sprintf("%s: SIGKILL %s (owned %v)", label, victim, parts), sentAtKill: sent.Load()}
		t0 := r.kill(victim)
		d := r.probeFailover(t0, probeConv, probed)
		k.first, k.last, k.perPartition = spread(d)
		k.parts = len(d)
		k.takenLog = r.takenSince(t0)
		k.takenLog = append(k.takenLog, r.linesSince(t0, restoredLine)...)
		t.Logf("%s, %d of %d load turns published: first probe applied by a survivor %v after the kill, last %v (%s)",
			k.what, k.sentAtKill, len(load), k.first.Round(time.Millisecond), k.last.Round(time.Millisecond), k.perPartition)
		for _, l := range k.takenLog {
			t.Logf("  after the kill, %s", l)
		}
		slow = slow || k.first > 5*time.Second
		if k.first > failoverLimit {
			t.Errorf("%s: the first probe took %v after the kill (limit %v, goal 5s)", k.what, k.first, failoverLimit)
		}
		kills = append(kills, k)
	}

	// 1. The instance owning the most partitions.
	loseInstance("kill 1")

	// 2. The node leading the changelog: every commit appends there.
	stateLeader := r.cl.WaitStreamLeader(bus.StreamState)
	alsoIn := r.cl.StreamLeader(bus.StreamIn) == stateLeader
	burstNow()
	nodeAt := sent.Load()
	t0 := time.Now()
	node := r.cl.KillByName(stateLeader)
	d := r.probeFailover(t0, probeConv, allParts)
	first, last, per := spread(d)
	t.Logf("kill 2: NATS node %s (leader of %s, of %s too: %v), %d of %d load turns published: probes of every partition applied %v to %v after the kill (%s)",
		stateLeader, bus.StreamState, bus.StreamIn, alsoIn, nodeAt, len(load), first.Round(time.Millisecond), last.Round(time.Millisecond), per)
	// Past the slowest node loss seen (the server's elections take most of
	// it), its logs are kept as well.
	slow = slow || last > 15*time.Second

	// 3. The next instance owning the most partitions, the node still down.
	loseInstance("kill 3")
	close(hurry)
	hurried = true

	// The node and the killed instances come back: they catch up from the
	// changelog.
	r.cl.Restart(node)
	r.cl.WaitStreamLeader(bus.StreamState)
	for _, in := range r.insts {
		if !in.alive() {
			r.start(in)
		}
	}
	for _, in := range r.insts {
		r.waitReady(in)
	}
	if err := <-loaded; err != nil {
		t.Fatalf("load: %v", err)
	}
	t.Logf("load of %d turns published %v after the start", len(load), time.Since(began).Round(time.Millisecond))

	// Drain: every conversation's last turn applied, nothing pending or
	// unacked on any partition, every instance at the changelog's end.
	r.mu.Lock()
	byConv := make(map[string][]schema.Turn, len(r.byConv))
	for k, v := range r.byConv {
		byConv[k] = slices.Clone(v)
	}
	order := slices.Clone(r.order)
	r.mu.Unlock()
	for _, turns := range byConv {
		if err := awaitApplied(ctx, r.c, turns[len(turns)-1], time.Until(deadline)); err != nil {
			t.Fatal(err)
		}
	}
	drain(ctx, t, r.c.js)
	var logEnd uint64
	if err := bus.RetryStart(ctx, testLogger(t), "read CTX_STATE", func(ctx context.Context) error {
		st, err := r.c.js.Stream(ctx, bus.StreamState)
		if err == nil {
			logEnd = st.CachedInfo().State.LastSeq
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, in := range r.insts {
		for {
			behind, ok := r.gauge(in, "ctxpipe_changelog_behind")
			if ok && behind == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s has %v partitions behind the changelog", in, behind)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	t.Logf("drained %v after the start: %d inputs (%d load, %d probe turns), %d changelog messages",
		time.Since(began).Round(time.Millisecond), len(order), len(load), len(order)-len(load), logEnd)
	for _, in := range r.insts {
		r.stop(in)
	}
	// Every instance, for the conversations of the partitions it holds
	// now: each input once, in order; CTX_EVENTS each of their events once.
	r.waitCurrent()
	onStream := readEventsBySeq(ctx, t, r.c.js)
	var names []string
	for _, in := range r.insts {
		names = append(names, in.name)
	}
	holders := map[string][]*scaleInst{} // per conversation key
	var fig crashFigures
	for _, in := range r.insts {
		held := heldPartitions(names, in.name, scalePartitions, standby)
		// Each file holds the partitions that map to it (p mod files).
		for file := range in.files {
			var inFile []int
			for _, p := range held {
				if p%in.files == file {
					inFile = append(inFile, p)
				}
			}
			sub := map[string][]schema.Turn{}
			var subOrder []schema.Turn
			for _, tn := range order {
				key := scaleKey(tn.ConversationID)
				if slices.Contains(inFile, bus.PartitionOf(scaleTenant, tn.ConversationID, scalePartitions)) {
					subOrder = append(subOrder, tn)
					if len(sub[key]) == 0 {
						holders[key] = append(holders[key], in)
					}
					sub[key] = append(sub[key], tn)
				}
			}
			var subStream []streamEvent
			for _, se := range onStream {
				if _, ok := sub[se.ev.Header().ConversationID]; ok {
					subStream = append(subStream, se)
				}
			}
			if len(subOrder) == 0 {
				continue // a file none of whose partitions this instance holds
			}
			path := filepath.Join(in.dataDir, store.SetFileName(file))
			t.Logf("verifying %s's SQLite (%s): partitions %v, %d conversations", in, filepath.Base(path), inFile, len(sub))
			f := verifyStored(ctx, t, path, subOrder, sub, subStream, false)
			fig.events += f.events
			fig.condenses += f.condenses
			fig.truncations += f.truncations
		}
	}
	for key := range byConv {
		if len(holders[key]) != 1+standby {
			t.Fatalf("%s is held by %v, want %d instances", key, holders[key], 1+standby)
		}
	}
	t.Logf("each instance holds its partitions' inputs once each, in order, and their events once each on CTX_EVENTS (%d condense_context, %d sliding_window_truncation, counting each copy)",
		fig.condenses, fig.truncations)

	// One instance alone, on a single server, the same inputs.
	single := singleRun(t, ctx, r.bin, r.env, profiles, filepath.Join(r.dir, "single"), order, byConv)
	b, err := store.Open(ctx, single)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// Each instance's files, by file index.
	dbs := map[*scaleInst][]*store.Store{}
	for _, in := range r.insts {
		for file := range in.files {
			a, err := store.Open(ctx, filepath.Join(in.dataDir, store.SetFileName(file)))
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			dbs[in] = append(dbs[in], a)
		}
	}
	partOf := map[string]int{} // per conversation key
	for _, tn := range order {
		partOf[scaleKey(tn.ConversationID)] = bus.PartitionOf(scaleTenant, tn.ConversationID, scalePartitions)
	}
	msgs := 0
	for key := range byConv {
		mb, err := b.Messages(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		eb, err := b.Events(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range holders[key] {
			a := dbs[in][partOf[key]%in.files]
			ma, err := a.Messages(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(ma, mb) {
				i := 0
				for i < min(len(ma), len(mb)) && reflect.DeepEqual(ma[i], mb[i]) {
					i++
				}
				t.Fatalf("%s in %s: history differs from the single-instance run's at message %d (%d vs %d messages)", key, in, i, len(ma), len(mb))
			}
			ea, err := a.Events(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if ia, ib := eventIDs(ea), eventIDs(eb); !slices.Equal(ia, ib) {
				t.Fatalf("%s in %s: events differ from the single-instance run's:\n%v\n%v", key, in, ia, ib)
			}
		}
		msgs += len(mb)
	}
	t.Logf("every conversation's history (%d messages) and events, in each instance holding it, equal a single instance's run of the same inputs", msgs)
	for _, k := range kills {
		t.Logf("figure: %s: kill -> first input applied by a survivor %v (last of %d partitions %v)",
			k.what, k.first.Round(time.Millisecond), k.parts, k.last.Round(time.Millisecond))
	}
	t.Logf("figure: node kill -> every partition applying again %v; whole test %v", last.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
}

// waitCurrent waits until each stream has a leader and its other replicas
// are current.
func (r *scaleRig) waitCurrent() {
	r.t.Helper()
	for _, name := range []string{bus.StreamIn, bus.StreamState, bus.StreamEvents} {
		for {
			ictx, cancel := context.WithTimeout(r.ctx, 2*time.Second)
			s, err := r.c.js.Stream(ictx, name)
			cancel()
			if err == nil {
				if c := s.CachedInfo().Cluster; c != nil && c.Leader != "" && len(c.Replicas) == natstest.ClusterSize-1 &&
					!slices.ContainsFunc(c.Replicas, func(p *jetstream.PeerInfo) bool { return !p.Current }) {
					break
				}
			}
			if time.Now().After(r.deadline) {
				r.t.Fatalf("stream %s: replicas not current: %v", name, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// readEventsBySeq reads every message of CTX_EVENTS by its sequence, each
// read retried. (readEvents's ordered consumer creates a consumer per
// Next; on a cluster a consumer just created on one node is not always
// reachable from another at once, and the read failed with "no
// responders".)
func readEventsBySeq(ctx context.Context, t *testing.T, js jetstream.JetStream) []streamEvent {
	t.Helper()
	var s jetstream.Stream
	if err := bus.RetryStart(ctx, testLogger(t), "read CTX_EVENTS", func(ctx context.Context) (err error) {
		s, err = js.Stream(ctx, bus.StreamEvents)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	state := s.CachedInfo().State
	var out []streamEvent
	for seq := state.FirstSeq; seq <= state.LastSeq && state.Msgs > 0; seq++ {
		var m *jetstream.RawStreamMsg
		err := bus.RetryStart(ctx, testLogger(t), "read CTX_EVENTS", func(ctx context.Context) (err error) {
			m, err = s.GetMsg(ctx, seq)
			return err
		})
		if err != nil {
			t.Fatalf("%s message %d: %v", bus.StreamEvents, seq, err)
		}
		ev, err := schema.DecodeEvent(m.Data)
		if err != nil {
			t.Fatalf("event on %s: %v", m.Subject, err)
		}
		if want := schema.EventSubject(ev); m.Subject != want {
			t.Fatalf("event %s on subject %s, want %s", ev.Header().ID, m.Subject, want)
		}
		out = append(out, streamEvent{msgID: m.Header.Get(jetstream.MsgIDHeader), ev: ev})
	}
	return out
}

// eventIDs is each event's id and type, in stored order.
func eventIDs(evs []schema.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.Header().ID + "/" + string(e.Header().Type)
	}
	return out
}

// singleRun applies the turns with one instance on one server, and returns
// its SQLite file once it has stopped.
func singleRun(t *testing.T, ctx context.Context, bin string, env []string, profiles, dir string, order []schema.Turn, byConv map[string][]schema.Turn) string {
	t.Helper()
	began := time.Now()
	_, url := natstest.Run(t)
	c := connect(t, url)
	if err := bus.RetryStart(ctx, testLogger(t), "ensure streams", func(ctx context.Context) error {
		return bus.EnsureStreams(ctx, c.js, bus.WithPartitions(scalePartitions))
	}); err != nil {
		t.Fatal(err)
	}
	var futures []jetstream.PubAckFuture
	for _, tn := range order {
		data, err := schema.Marshal(tn)
		if err != nil {
			t.Fatal(err)
		}
		f, err := c.js.PublishAsync(schema.InputSubject(scaleKey(tn.ConversationID), schema.KindTurn), data,
			jetstream.WithMsgID(tn.ID), jetstream.WithExpectStream(bus.StreamIn))
		if err != nil {
			t.Fatal(err)
		}
		futures = append(futures, f)
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			t.Fatal(err)
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
	p := startConsumer(t, bin, filepath.Join(dir+".log"), env, "--nats-url", url, "--data-dir", dir, "--name", "single",
		"--profiles", profiles, "--partitions", strconv.Itoa(scalePartitions), "--http", "", "--log-level", "info")
	for _, turns := range byConv {
		if err := awaitApplied(ctx, c, turns[len(turns)-1], time.Until(mustDeadline(ctx))); err != nil {
			t.Fatalf("single instance: %v", err)
		}
	}
	drain(ctx, t, c.js)
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := p.wait(); err != nil {
		t.Fatalf("graceful stop of the single instance: %v", err)
	}
	t.Logf("single-instance run of the %d inputs: %v", len(order), time.Since(began).Round(time.Millisecond))
	return filepath.Join(dir, "ctxpipe.db")
}

// drain waits until no partition consumer has inputs pending or unacked.
func drain(ctx context.Context, t *testing.T, js jetstream.JetStream) {
	t.Helper()
	for {
		ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
		info := consumersInfo(ictx, t, js)
		cancel()
		if info.NumPending == 0 && info.NumAckPending == 0 {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("partition consumers not drained: %d pending, %d unacked", info.NumPending, info.NumAckPending)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func mustDeadline(ctx context.Context) time.Time {
	d, ok := ctx.Deadline()
	if !ok {
		return time.Now().Add(time.Minute)
	}
	return d
}
