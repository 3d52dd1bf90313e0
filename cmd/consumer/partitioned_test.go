package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/internal/natstest"
	"github.com/ctxpipe/ctxpipe/pipeline"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/store"
)

// heldPartitions is what pipeline.Assign has instance name hold among names.
func heldPartitions(names []string, name string, n, standby int) []int {
	a := pipeline.Assign(n+1, names, name, true, standby)
	var out []int
	for p, ok := range a.Held {
		if ok {
			out = append(out, p)
		}
	}
	return out
}

// pulledPartitions is how many partitions pipeline.Assign has instance name
// pull among names.
func pulledPartitions(names []string, name string, n int) int {
	a := pipeline.Assign(n+1, names, name, true, 0)
	pulled := 0
	for _, ok := range a.Pull {
		if ok {
			pulled++
		}
	}
	return pulled
}

// waitHolding waits until each instance holds (restored) the partitions
// the assignment over all of them gives it, has none of them behind, and
// pulls exactly its share.
func (r *scaleRig) waitHolding(n, standby int) {
	r.t.Helper()
	var names []string
	for _, in := range r.insts {
		names = append(names, in.name)
	}
	for _, in := range r.insts {
		want := float64(len(heldPartitions(names, in.name, n, standby)))
		pulls := float64(pulledPartitions(names, in.name, n))
		for {
			held, ok1 := r.gauge(in, "ctxpipe_partitions_held")
			behind, ok2 := r.gauge(in, "ctxpipe_changelog_behind")
			pulling, ok3 := r.gauge(in, "ctxpipe_partitions_pulling")
			if ok1 && ok2 && ok3 && held == want && behind == 0 && pulling == pulls {
				break
			}
			if time.Now().After(r.deadline) {
				r.t.Fatalf("%s holds %v partitions (%v behind) and pulls %v, want %v held and %v pulled", in, held, behind, pulling, want, pulls)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// TestInstancesHoldTheirPartitions runs three instances of the real binary
// against a server started from nats.conf (the service as its ctxpipe
// user, the load as tenant acme's agent), with --standby 0 and 1. The
// partitions spread before any input arrives; a tenant's queries, answered
// by whichever instance the queue group picks, answer for every
// conversation (an instance that does not hold one passes the query on);
// every instance's dashboard lists and shows every conversation; and each
// instance's SQLite file holds exactly the conversations of the partitions
// it owns or stands by for, each whole.
func TestInstancesHoldTheirPartitions(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs three service binaries")
	}
	for _, standby := range []int{0, 1} {
		t.Run("standby="+strconv.Itoa(standby), func(t *testing.T) { testHoldTheirPartitions(t, standby) })
	}
}

func testHoldTheirPartitions(t *testing.T, standby int) {
	const (
		n     = 12
		convs = 30
		turns = 5
	)
	began := time.Now()
	deadline := began.Add(3 * time.Minute)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	t.Cleanup(cancel)
	_, url := natstest.RunWithConfig(t, "../../nats.conf")
	r := &scaleRig{t: t, ctx: ctx, deadline: deadline, bin: buildConsumer(t), dir: t.TempDir()}
	r.args = []string{"--nats-url", url, "--nats-user", "ctxpipe", "--nats-password", "ctxpipe-demo-password",
		"--partitions", strconv.Itoa(n), "--standby", strconv.Itoa(standby), "--log-level", "info"}
	for i := 1; i <= 3; i++ {
		r.insts = append(r.insts, &scaleInst{name: fmt.Sprintf("inst-%d", i), dataDir: filepath.Join(r.dir, fmt.Sprintf("data-%d", i)), files: 1})
	}
	// Started together, as a deployment is: the partitions spread before
	// any input arrives (each instance pulls its share at once), so that
	// none is taken by one instance and handed over during the load.
	for _, in := range r.insts {
		r.start(in)
	}
	for _, in := range r.insts {
		r.waitReady(in)
	}
	r.waitHolding(n, standby)
	t.Logf("3 instances up and holding their partitions %v after the start", time.Since(began).Round(time.Millisecond))

	agent := connect(t, url, nats.UserInfo("acme-agent", "acme-agent-demo-password"), nats.CustomInboxPrefix("_INBOX_acme-agent"))
	rng := rand.New(rand.NewPCG(25, 25))
	sent := map[string][]schema.Turn{}
	ts := time.Now().UnixMilli()
	for i := range turns {
		for c := range convs {
			conv := fmt.Sprintf("held-%02d", c)
			tn := textTurn(rng, conv, "demo-16k", i, ts+int64(i), 30)
			agent.publishTurn(tn)
			sent[conv] = append(sent[conv], tn)
		}
	}
	forwarded := func() float64 {
		sum := 0.0
		for _, in := range r.insts {
			if v, ok := r.gauge(in, `ctxpipe_queries_forwarded_total`); ok {
				sum += v
			}
		}
		return sum
	}
	// Every conversation's last turn, waited for through whichever instance
	// the queue group picks; then its status and events the same way.
	for conv, tns := range sent {
		msgs, err := agent.history(conv, schema.ViewFull, tns[len(tns)-1].ID, 30*time.Second)
		if err != nil {
			t.Fatalf("history of %s: %v", conv, err)
		}
		if got, want := idsOf2(msgs), idsOf(tns); !slices.Equal(got, want) {
			t.Fatalf("history of %s: %v, want %v", conv, got, want)
		}
		st, err := agent.status(conv)
		if err != nil || st.Messages != turns {
			t.Fatalf("status of %s: %+v, %v", conv, st, err)
		}
		var evs schema.EventsReply
		if err := agent.query(schema.SubjectEvents, schema.EventsRequest{ConversationID: conv}, &evs, 5*time.Second); err != nil {
			t.Fatalf("events of %s: %v", conv, err)
		}
	}
	if _, err := agent.status("never-sent"); !isQueryCode(err, schema.QueryNotFound) {
		t.Fatalf("status of a conversation nobody sent: %v, want not_found", err)
	}
	t.Logf("queries forwarded to the holder of their partition: %v", forwarded())
	if forwarded() == 0 {
		t.Fatal("no query was passed on: every instance answered alone")
	}
	var names []string
	for _, in := range r.insts {
		names = append(names, in.name)
	}
	// Each partition's inputs were taken by its preferred instance, and
	// none was handed over while they came: the partitions had spread
	// before the load.
	for _, in := range r.insts {
		for _, m := range logMatches(in.log, ownerLine) {
			p, _ := strconv.Atoi(m[3])
			if m[2] != "partition taken" {
				t.Fatalf("%s handed partition %d over during the load (%s)", in, p, m[1])
			}
			if want := pipeline.Preferred(p, names); want != in.name {
				t.Fatalf("%s took partition %d during the load; %s is its owner", in, p, want)
			}
		}
	}
	checkDashboards(t, r.insts, sent, n, turns)
	r.waitHolding(n, standby)
	for _, in := range r.insts {
		r.stop(in)
	}

	copies := map[string]int{}
	for _, in := range r.insts {
		held := heldPartitions(names, in.name, n, standby)
		var want []string
		for conv := range sent {
			if slices.Contains(held, bus.PartitionOf("acme", conv, n)) {
				want = append(want, schema.ConversationKey("acme", conv))
			}
		}
		sort.Strings(want)
		st, err := store.Open(ctx, in.db())
		if err != nil {
			t.Fatal(err)
		}
		got, err := st.Conversations(ctx)
		if err != nil {
			t.Fatal(err)
		}
		sort.Strings(got)
		if !slices.Equal(got, want) {
			st.Close()
			t.Fatalf("%s (partitions %v) holds conversations %v, want %v", in, held, got, want)
		}
		for _, key := range got {
			_, conv := schema.SplitKey(key)
			msgs, err := st.Messages(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if ids := idsOf2(msgs); !slices.Equal(ids, idsOf(sent[conv])) {
				st.Close()
				t.Fatalf("%s: %s holds %v, want %v", in, key, ids, idsOf(sent[conv]))
			}
			copies[key]++
		}
		st.Close()
		t.Logf("%s holds partitions %v: %d of %d conversations", in, held, len(got), convs)
	}
	for conv := range sent {
		if c := copies[schema.ConversationKey("acme", conv)]; c != 1+standby {
			t.Fatalf("%s: %d copies, want %d", conv, c, 1+standby)
		}
	}
}

// idsOf2 is the ids of the messages that are turns.
func idsOf2(msgs []schema.Message) []string {
	var out []string
	for _, m := range msgs {
		if !m.Synthetic() {
			out = append(out, m.ID)
		}
	}
	return out
}

// checkDashboards reads the dashboard of every instance: each lists every
// conversation sent, whichever instance holds it, with its messages, and
// shows each one's history (read from its partition's owner); a condense
// asked through an instance that does not hold the conversation is
// accepted.
func checkDashboards(t *testing.T, insts []*scaleInst, sent map[string][]schema.Turn, n, turns int) {
	t.Helper()
	type row struct {
		Key      string `json:"key"`
		Messages int    `json:"messages"`
	}
	var want []string
	for conv := range sent {
		want = append(want, schema.ConversationKey("acme", conv))
	}
	sort.Strings(want)
	for _, in := range insts {
		var list struct {
			Conversations []row `json:"conversations"`
			Missing       []int `json:"missing_partitions"`
		}
		code, body := httpGet(t, "http://"+in.http+"/api/conversations")
		if code != http.StatusOK || json.Unmarshal([]byte(body), &list) != nil {
			t.Fatalf("%s's dashboard list: %d %s", in, code, body)
		}
		var got []string
		for _, r := range list.Conversations {
			got = append(got, r.Key)
			if r.Messages != turns {
				t.Fatalf("%s's dashboard lists %s with %d messages, want %d", in, r.Key, r.Messages, turns)
			}
		}
		sort.Strings(got)
		if !slices.Equal(got, want) || len(list.Missing) != 0 {
			t.Fatalf("%s's dashboard lists %v (partitions missing: %v), want every conversation %v", in, got, list.Missing, want)
		}
	}
	i := 0
	for conv, tns := range sent {
		in := insts[i%len(insts)]
		i++
		key := schema.ConversationKey("acme", conv)
		var view struct {
			History []struct {
				ID string `json:"id"`
			} `json:"history"`
		}
		code, body := httpGet(t, "http://"+in.http+"/api/conversations/"+key)
		if code != http.StatusOK || json.Unmarshal([]byte(body), &view) != nil {
			t.Fatalf("%s's dashboard view of %s: %d %s", in, key, code, body)
		}
		var ids []string
		for _, h := range view.History {
			ids = append(ids, h.ID)
		}
		if !slices.Equal(ids, idsOf(tns)) {
			t.Fatalf("%s's dashboard shows %s with %v, want %v", in, key, ids, idsOf(tns))
		}
	}
	if code, body := httpGet(t, "http://"+insts[0].http+"/api/conversations/acme.never-sent"); code != http.StatusNotFound {
		t.Fatalf("a conversation nobody sent: %d %s, want 404", code, body)
	}
	// A control asked through an instance that does not hold the
	// conversation finds it (at its owner): this rewind without a ts then
	// fails its own check, changing nothing; one of a conversation nobody
	// sent is not found.
	var names []string
	for _, in := range insts {
		names = append(names, in.name)
	}
	for conv := range sent {
		key := schema.ConversationKey("acme", conv)
		owner := pipeline.Preferred(bus.PartitionOf("acme", conv, n), names)
		for _, in := range insts {
			if in.name == owner {
				continue
			}
			if code, body := httpPost(t, "http://"+in.http+"/api/conversations/"+key+"/rewind", `{}`); code != http.StatusBadRequest || !strings.Contains(body, "needs ts") {
				t.Fatalf("a rewind of %s without a ts through %s (not its owner %s): %d %s, want 400", key, in, owner, code, body)
			}
			if code, body := httpPost(t, "http://"+in.http+"/api/conversations/acme.never-sent/rewind", `{}`); code != http.StatusNotFound {
				t.Fatalf("a rewind of a conversation nobody sent: %d %s, want 404", code, body)
			}
			return
		}
	}
}

// httpPost posts a JSON body and returns the status and the answer.
func httpPost(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}
