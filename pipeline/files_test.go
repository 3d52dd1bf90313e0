package pipeline_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/internal/natstest"
	"github.com/ctxpipe/ctxpipe/pipeline"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/store"
)

// With the state split over files, each conversation's inputs, messages,
// events and changelog position land in the file of its partition and in
// no other; every file commits (its own committer), events leave through
// each file's relay, queries read the right file, and a restart on the same
// files goes on from each file's positions without applying anything
// twice or losing anything.
func TestStateSplitOverFiles(t *testing.T) {
	const files = 3
	_, url := natstest.Run(t)
	dir := t.TempDir()
	cfg := pipeline.Config{Lanes: 4, AckWait: 5 * time.Second, MaxDeliver: 5, RetryBudget: time.Second}
	h := startFiles(t, url, cfg, nil, dir, files)
	ctx := context.Background()

	type conv struct{ key, conv string }
	var convs []conv
	for _, tenant := range []string{"acme", "globex", "initech"} {
		for i := range 4 {
			convs = append(convs, conv{tenant + "." + fmt.Sprintf("c%d", i), fmt.Sprintf("c%d", i)})
		}
	}
	convs = append(convs, conv{"plain", "plain"}) // the shared partition
	last := map[string]string{}
	turn := func(c conv) {
		tn := schema.Turn{ID: uuid.NewString(), ConversationID: c.conv, TS: h.nextTS(), Role: schema.RoleUser,
			Content: schema.TextContent("hello from " + c.key)}
		h.publish(schema.InputSubject(c.key, schema.KindTurn), tn.ID, tn)
		last[c.key] = tn.ID
	}
	for range 3 {
		for _, c := range convs {
			turn(c)
		}
	}
	h.publishRaw(schema.InputSubject("acme.c0", schema.KindTurn), "bad-1", []byte(`{"id": nope`))

	// The runner knows its partitions once it has made their consumers,
	// which may be after the publishes: read before, N is 0 and every
	// conversation seems to be in file 0.
	waitFor(t, func() bool { return h.runner.Partitions() > 0 })
	n := h.runner.Partitions()
	fileOf := func(key string) int {
		tenant, c := schema.SplitKey(key)
		return bus.PartitionOf(tenant, c, n) % files
	}
	applied := func(key string) func() bool {
		return func() bool {
			tenant, _ := schema.SplitKey(key)
			seen, err := h.set.File(fileOf(key)).SeenInputs(ctx, tenant, []string{last[key]})
			return err == nil && len(seen) == 1
		}
	}
	for _, c := range convs {
		waitFor(t, applied(c.key))
	}
	used := map[int]bool{}
	for _, c := range convs {
		f := fileOf(c.key)
		used[f] = true
		if f != h.set.FileOfKey(c.key) {
			t.Fatalf("%s: the set puts it in file %d, its partition in %d", c.key, h.set.FileOfKey(c.key), f)
		}
		for i := range files {
			msgs, err := h.set.File(i).Messages(ctx, c.key)
			if err != nil {
				t.Fatal(err)
			}
			if want := map[bool]int{true: 3, false: 0}[i == f]; len(msgs) != want {
				t.Fatalf("%s: %d messages in file %d, want %d (its file is %d)", c.key, len(msgs), i, want, f)
			}
		}
	}
	if len(used) < 2 {
		t.Fatalf("the conversations fell in %d file(s): the test needs several", len(used))
	}
	for i := range files {
		pos, _, err := h.set.File(i).LogPositions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if used[i] && len(pos) == 0 {
			t.Fatalf("file %d holds conversations but no changelog position", i)
		}
		for p := range pos {
			if p%files != i {
				t.Fatalf("file %d has a position of partition %d (file %d's)", i, p, p%files)
			}
		}
	}
	// A query reads the conversation's file.
	if msgs := h.history("plain", schema.ViewFull, ""); len(msgs) != 3 {
		t.Fatalf("history of plain: %d messages, want 3", len(msgs))
	}
	// The rejection's event left through its file's relay.
	for _, r := range h.relays {
		if err := r.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if evs := readEvents(ctx, t, h.js, "ctx.events.acme.>"); !hasRejection(evs) {
		t.Fatalf("no input_rejected event on CTX_EVENTS for acme: %d events", len(evs))
	}
	if h.metrics.Value("ctxpipe_commits_total", "") < 2 {
		t.Fatalf("%v commits", h.metrics.Value("ctxpipe_commits_total", ""))
	}

	// Again, on the same files: each goes on from its positions.
	h.stop()
	h = startFiles(t, url, cfg, nil, dir, files)
	for _, c := range convs {
		turn(c)
	}
	for _, c := range convs {
		waitFor(t, applied(c.key))
		msgs, err := h.set.File(fileOf(c.key)).Messages(ctx, c.key)
		if err != nil {
			t.Fatal(err)
		}
		if len(msgs) != 4 {
			t.Fatalf("%s after a restart: %d messages, want 4", c.key, len(msgs))
		}
	}
	if v := h.metrics.Value("ctxpipe_changelog_changes_total", ""); v != 0 {
		t.Fatalf("the restart applied %v changes of the changelog again", v)
	}
}

func hasRejection(evs []schema.Event) bool {
	for _, e := range evs {
		if _, ok := e.(*schema.InputRejected); ok {
			return true
		}
	}
	return false
}

// The set's file of a conversation is its partition's, as the server's
// transform computes it.
func TestSetFileOfKey(t *testing.T) {
	set := store.NewSet(nil, nil, nil, nil)
	set.SetPartitions(8)
	for _, key := range []string{"acme.a", "acme.b", "globex.x", "plain", "t.c-1"} {
		tenant, c := schema.SplitKey(key)
		if got, want := set.FileOfKey(key), bus.PartitionOf(tenant, c, 8)%4; got != want {
			t.Fatalf("%s: file %d, want %d", key, got, want)
		}
	}
	if got := set.FileOf(8); got != 0 {
		t.Fatalf("the shared partition 8 of 8: file %d, want 0", got)
	}
}
