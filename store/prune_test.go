package store

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/google/uuid"
)

// clock is a settable clock for WithClock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) set(t time.Time) { c.mu.Lock(); c.t = t; c.mu.Unlock() }

// eventEntry is an applied turn carrying one event, so it has an outbox row.
func eventEntry(conv string) Entry {
	e := turnEntry(conv, msg(conv, uuid.NewString(), 1, schema.RoleUser, "x"))
	e.Changes.Events = []schema.Event{&schema.CondenseFailed{EventHeader: schema.EventHeader{ID: uuid.NewString(),
		Type: schema.EventCondenseFailed, ConversationID: conv, InputID: e.Input.ID}, Error: schema.ReasonLLMError}}
	return e
}

func publishOutbox(t *testing.T, s *Store, eventID string) {
	t.Helper()
	var seq int64
	if err := s.r.QueryRow("SELECT seq FROM outbox WHERE event_id = ?", eventID).Scan(&seq); err != nil {
		t.Fatal(err)
	}
	if err := s.markPublished(context.Background(), []int64{seq}, 0); err != nil {
		t.Fatal(err)
	}
}

func outboxHas(t *testing.T, s *Store, eventID string) bool {
	t.Helper()
	var n int
	if err := s.r.QueryRow("SELECT COUNT(*) FROM outbox WHERE event_id = ?", eventID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// pruneFixture stores, on a clock stepping one hour at a time: an old and a
// new published event, an old unpublished one, an old and a new rejection,
// and an old applied input.
type pruneFixture struct {
	oldPub, newPub, oldPending Entry
	oldRej, newRej, oldApplied Entry
	cutoff                     time.Time
}

func newPruneFixture(t *testing.T, s *Store, c *clock) pruneFixture {
	t.Helper()
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f := pruneFixture{oldPub: eventEntry("c"), newPub: eventEntry("c"), oldPending: eventEntry("c"),
		oldRej: rejectedEntry("c", bytes.Repeat([]byte("r"), 9000)), newRej: rejectedEntry("c", []byte("late")),
		oldApplied: eventEntry("d"), cutoff: base.Add(90 * time.Minute)}
	c.set(base)
	commit(t, s, f.oldPub, f.oldPending, f.oldRej, f.oldApplied)
	publishOutbox(t, s, f.oldPub.Changes.Events[0].Header().ID)
	publishOutbox(t, s, f.oldApplied.Changes.Events[0].Header().ID)
	c.set(base.Add(2 * time.Hour))
	commit(t, s, f.newPub, f.newRej)
	publishOutbox(t, s, f.newPub.Changes.Events[0].Header().ID)
	return f
}

func TestPrune(t *testing.T) {
	ctx := context.Background()
	c := &clock{}
	s := openStore(t, WithClock(c.now))
	f := newPruneFixture(t, s, c)
	before := messagesOf(t, s, "c")

	// Nothing to prune with zero cutoffs.
	if res, err := s.Prune(ctx, PruneOptions{}); err != nil || res != (PruneResult{}) {
		t.Fatalf("Prune(zero) = %+v, %v", res, err)
	}
	res, err := s.Prune(ctx, PruneOptions{PublishedEventsBefore: f.cutoff, RejectionsBefore: f.cutoff})
	if err != nil {
		t.Fatal(err)
	}
	if want := (PruneResult{OutboxRows: 2, RejectedPayloads: 1}); res != want {
		t.Fatalf("Prune = %+v, want %+v", res, want)
	}
	outbox := []struct {
		name string
		e    Entry
		kept bool
	}{
		{"old published", f.oldPub, false},
		{"old published (other conversation)", f.oldApplied, false},
		{"new published", f.newPub, true},
		{"old unpublished", f.oldPending, true},
	}
	for _, o := range outbox {
		if got := outboxHas(t, s, o.e.Changes.Events[0].Header().ID); got != o.kept {
			t.Errorf("outbox row of %s kept = %v, want %v", o.name, got, o.kept)
		}
	}
	inputs := []struct {
		name       string
		e          Entry
		hasPayload bool
	}{
		{"old rejection", f.oldRej, false},
		{"new rejection", f.newRej, true},
		{"old applied", f.oldApplied, true},
	}
	for _, in := range inputs {
		_, hash, size, has := storedInput(t, s, in.e.Input.ID)
		want := PayloadHash(in.e.Input.Payload)
		if has != in.hasPayload || !bytes.Equal(hash, want[:]) || size != len(in.e.Input.Payload) {
			t.Errorf("%s: payload kept %v (want %v), hash %x, size %d", in.name, has, in.hasPayload, hash, size)
		}
	}
	// The pruned rejection still makes its redelivery a duplicate, not a
	// conflict: the hash survives.
	if r := commit(t, s, f.oldRej); !r[0].Duplicate || r[0].Conflict {
		t.Errorf("redelivered pruned rejection = %+v, want a plain duplicate", r[0])
	}
	// Events and messages are never pruned.
	if evs, err := s.Events(ctx, "c"); err != nil || len(evs) != 3 {
		t.Errorf("events after prune = %d, %v; want 3", len(evs), err)
	}
	if got := messagesOf(t, s, "c"); len(got) != len(before) {
		t.Errorf("messages after prune = %d, want %d", len(got), len(before))
	}
	// Pruning again finds nothing.
	if res, err := s.Prune(ctx, PruneOptions{PublishedEventsBefore: f.cutoff, RejectionsBefore: f.cutoff}); err != nil || res != (PruneResult{}) {
		t.Fatalf("second Prune = %+v, %v", res, err)
	}
}

func TestPruneManyChunks(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	var batch []Entry
	for range pruneChunk*2 + 7 {
		batch = append(batch, eventEntry("c"), rejectedEntry("c", []byte("bad")))
	}
	commit(t, s, batch...)
	if _, err := s.w.Exec("UPDATE outbox SET published_at = 1"); err != nil {
		t.Fatal(err)
	}
	res, err := s.Prune(ctx, PruneOptions{PublishedEventsBefore: time.Now(), RejectionsBefore: time.Now().Add(time.Hour)})
	if n := int64(pruneChunk*2 + 7); err != nil || res.OutboxRows != n || res.RejectedPayloads != n {
		t.Fatalf("Prune = %+v, %v; want %d of each", res, err, n)
	}
}

// syncBuffer is a log sink safe for the pruner's goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}
func (b *syncBuffer) String() string { b.mu.Lock(); defer b.mu.Unlock(); return b.b.String() }

func TestRunPrunerPrunesOnSchedule(t *testing.T) {
	c := &clock{}
	s := openStore(t, WithClock(c.now))
	f := newPruneFixture(t, s, c)
	// Retention 1h at 2h30: the cutoff is 1h30, as in TestPrune.
	c.set(f.cutoff.Add(time.Hour))
	var logs syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		RunPruner(ctx, s, 10*time.Millisecond, time.Hour, slog.New(slog.NewTextHandler(&logs, nil)))
		close(done)
	}()
	// The deadline only bounds a broken pruner.
	deadline := time.Now().Add(30 * time.Second)
	// Wait for the pruner's line: the outbox row may be gone while the
	// same round still clears the rejected payloads.
	for outboxHas(t, s, f.oldPub.Changes.Events[0].Header().ID) || !strings.Contains(logs.String(), "msg=pruned") {
		if time.Now().After(deadline) {
			t.Fatalf("the pruner never pruned (log %q)", logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	if !outboxHas(t, s, f.oldPending.Changes.Events[0].Header().ID) {
		t.Fatal("the pruner deleted an unpublished outbox row")
	}
	if out := logs.String(); !strings.Contains(out, "outbox_rows=2") || !strings.Contains(out, "rejected_payloads=1") {
		t.Fatalf("pruner log = %q, want the counts", out)
	}
}

// RunPruner returns, with a line saying why, instead of spinning or logging
// forever.
func TestRunPrunerReturns(t *testing.T) {
	tests := []struct {
		name             string
		every, retention time.Duration
		closed           bool
		log              string
	}{
		{"zero interval", 0, time.Hour, false, "must be positive"},
		{"negative retention", time.Hour, -time.Hour, false, "must be positive"},
		{"store closed", time.Millisecond, time.Hour, true, "store closed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := openStore(t)
			if tc.closed {
				s.Close()
			}
			var logs syncBuffer
			done := make(chan struct{})
			go func() {
				RunPruner(context.Background(), s, tc.every, tc.retention, slog.New(slog.NewTextHandler(&logs, nil)))
				close(done)
			}()
			select {
			case <-done:
			case <-time.After(30 * time.Second): // bounds a pruner that never returns
				t.Fatal("RunPruner did not return")
			}
			if !strings.Contains(logs.String(), tc.log) {
				t.Fatalf("log = %q, want %q", logs.String(), tc.log)
			}
		})
	}
}
