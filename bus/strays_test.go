package bus

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

func TestReached(t *testing.T) {
	const n = 4
	tests := []struct {
		subject string
		want    bool
	}{
		{"ctx.in.c1.turn", true},
		{"ctx.in.*.turn", true}, // the shared consumer's '*' covers a stored '*'
		{"ctx.in.c1.*", true},
		{"ctx.in.>.turn", false},
		{"ctx.in.c1.>", false},
		{"ctx.in.0.acme.c1.turn", true},
		{"ctx.in.3.acme.c1.turn", true},
		{"ctx.in.4.acme.c1.turn", false}, // no partition 4 of 4
		{"ctx.in.03.acme.c1.turn", false},
		{"ctx.in.-1.acme.c1.turn", false},
		{"ctx.in.acme.c1.turn", false}, // the tenant form, not transformed
		{"ctx.in.acme.*.turn", false},
		{"ctx.in.acme.>.turn", false},
		{"ctx.in.*.*.condense", false},
		{"ctx.in.>.c1.rewind", false},
		{"ctx.in.1.acme.>.turn", false},
		{"ctx.in.c1", false},
		{"ctx.in.a.b.c.d.e", false},
		{"ctx.in..turn", false},
		{"ctx.events.c1.turn", false},
	}
	for _, tt := range tests {
		if got := Reached(tt.subject, n); got != tt.want {
			t.Errorf("Reached(%q) = %v, want %v", tt.subject, got, tt.want)
		}
	}
}

// Reached, StraySubjects and StrayFilter are what the server does: every
// input CTX_IN stores, literal wildcard tokens and all, is delivered by a
// partition consumer's filter exactly when Reached says so; the stored
// subjects listed under StraySubjects are exactly the ones no partition
// reads; and StrayFilter delivers each, with the count the server gives
// for it.
func TestReachedIsWhatTheServerDelivers(t *testing.T) {
	const n = 4
	js, _ := newJS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := EnsureStreams(ctx, js, WithPartitions(n)); err != nil {
		t.Fatal(err)
	}
	published := []string{
		"ctx.in.c1.turn", "ctx.in.*.turn", "ctx.in.>.turn", "ctx.in.c1.*", "ctx.in.c1.>", "ctx.in.a*b.turn",
		"ctx.in.acme.c1.turn", "ctx.in.globex.c2.condense", "ctx.in.acme.*.turn", "ctx.in.acme.>.turn",
		"ctx.in.*.c1.turn", "ctx.in.>.c1.rewind", "ctx.in.acme.c1.*", "ctx.in.acme.c1.>", "ctx.in.*.*.*",
		"ctx.in.>.>.>", "ctx.in.acme.a*b.pin",
	}
	for _, subj := range published {
		if _, err := js.Publish(ctx, subj, []byte(`{}`), jetstream.WithExpectStream(StreamIn)); err != nil {
			t.Fatalf("publish %s: %v", subj, err)
		}
	}
	read := func(filter string) map[uint64]string {
		t.Helper()
		c, err := js.OrderedConsumer(ctx, StreamIn, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
		if err != nil {
			t.Fatal(err)
		}
		got := map[uint64]string{}
		for {
			// What the server has for the filter comes at once; the wait
			// only ends the read.
			m, err := c.Next(jetstream.FetchMaxWait(500 * time.Millisecond))
			if err != nil {
				return got
			}
			md, err := m.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			got[md.Sequence.Stream] = m.Subject()
		}
	}
	stored := read(InputSubjects) // stream sequence → subject as stored
	if len(stored) != len(published) {
		t.Fatalf("%s delivers %d of the %d inputs stored: %v", InputSubjects, len(stored), len(published), stored)
	}
	reached := map[uint64]int{}
	for p := 0; p <= n; p++ {
		for seq := range read(PartitionFilter(p, n)) {
			reached[seq]++
		}
	}
	for seq, subj := range stored {
		if got := reached[seq] > 0; got != Reached(subj, n) {
			t.Errorf("stored %s (published %s): a partition consumer delivers it: %v; Reached says %v",
				subj, published[seq-1], got, Reached(subj, n))
		}
		if reached[seq] > 1 {
			t.Errorf("stored %s: delivered by %d partitions", subj, reached[seq])
		}
	}

	s, err := js.Stream(ctx, StreamIn)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(StraySubjects))
	if err != nil {
		t.Fatal(err)
	}
	for seq, subj := range stored {
		_, listed := info.State.Subjects[subj]
		switch fiveTokens := strings.Count(subj, ".") == 4; {
		case listed != fiveTokens:
			t.Errorf("stored %s: listed under %s: %v", subj, StraySubjects, listed)
		case listed && Reached(subj, n):
			t.Errorf("stored %s: listed under %s, and a partition reads it", subj, StraySubjects)
		case !listed && !Reached(subj, n):
			// The shared form with a '>' token: what no listing short of
			// every shared subject finds (pipeline/strays.go).
			continue
		}
		if !listed {
			continue
		}
		// What the server counts for the filter is what it delivers.
		filter := StrayFilter(subj)
		c, err := js.OrderedConsumer(ctx, StreamIn, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
		if err != nil {
			t.Fatal(err)
		}
		ci, err := c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for range ci.NumPending {
			m, err := c.Next(jetstream.FetchMaxWait(10 * time.Second))
			if err != nil {
				t.Fatalf("stray %s: %s counts %d pending, delivers fewer: %v", subj, filter, ci.NumPending, err)
			}
			md, _ := m.Metadata()
			found = found || md.Sequence.Stream == seq
		}
		if !found {
			t.Errorf("stray %s: %s does not deliver it", subj, filter)
		}
	}
}

func TestStrayFilter(t *testing.T) {
	tests := map[string]string{
		"ctx.in.acme.>.turn":    "ctx.in.acme.>",
		"ctx.in.acme.*.turn":    "ctx.in.acme.>",
		"ctx.in.acme.c1.>":      "ctx.in.acme.c1.>",
		"ctx.in.acme.c1.*":      "ctx.in.acme.c1.>",
		"ctx.in.>.c1.rewind":    "ctx.in.>",
		"ctx.in.*.*.condense":   "ctx.in.>",
		"ctx.in.acme.a*b.turn":  "ctx.in.acme.a*b.turn",
		"ctx.in.3.acme.c1.turn": "ctx.in.3.acme.c1.turn",
	}
	for subj, want := range tests {
		if got := StrayFilter(subj); got != want {
			t.Errorf("StrayFilter(%q) = %q, want %q", subj, got, want)
		}
	}
}
