package main

import (
	"bytes"
	"context"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/ctxpipe/ctxpipe/client/clienttest"
	"github.com/ctxpipe/ctxpipe/schema"
)

// TestLoadAgents runs the agent workload against the real service in
// process: every turn is read back, incrementally, and each read carries
// only what was appended (no resets under a window nothing reaches), far
// fewer bytes than the full reads of the same workload.
func TestLoadAgents(t *testing.T) {
	svc := clienttest.New(t, clienttest.WithProfiles(
		schema.Profile{ID: schema.DefaultProfileID, ContextWindow: 1_000_000, MaxTokens: 8192}))
	perRead := func(extra ...string) int {
		t.Helper()
		var stdout, stderr bytes.Buffer
		args := append([]string{"load", "--nats-url", svc.URL, "--agent", "--convs", "3", "--turns", "12",
			"--size", "small", "--seed", "5"}, extra...)
		if code := run(context.Background(), args, &stdout, &stderr); code != 0 {
			t.Fatalf("load %v: exit %d: %s", extra, code, stderr.String())
		}
		m := regexp.MustCompile(`agents: 36 turns .* ([0-9,]+) bytes per read \(0 resets\)`).FindStringSubmatch(stderr.String())
		if m == nil {
			t.Fatalf("load %v: %s", extra, stderr.String())
		}
		n, _ := strconv.Atoi(string(bytes.ReplaceAll([]byte(m[1]), []byte(","), nil)))
		return n
	}
	inc := perRead()
	full := perRead("--full-reads", "--seed", "6")
	if inc*2 >= full {
		t.Fatalf("incremental reads average %d bytes, full reads %d", inc, full)
	}
}

// Generating the turns before the clock starts sends exactly what generating
// them on the way sends, in the same order.
func TestPregeneratedLoadIsTheSameLoad(t *testing.T) {
	const seed, convs, turns = 42, 7, 9
	var note bytes.Buffer
	pre := newWorkload(seed, convs, turns, SizeRealistic, "p", 1_700_000_000_000).source(&note, 0)
	live := newWorkload(seed, convs, turns, SizeRealistic, "p", 1_700_000_000_000).source(&note, 5)
	if !strings.Contains(note.String(), "63 turns (") {
		t.Fatalf("the load did not say it generated its turns first: %q", note.String())
	}
	n := 0
	for {
		a, okA := pre()
		b, okB := live()
		if okA != okB {
			t.Fatalf("turn %d: one source ended before the other", n)
		}
		if !okA {
			break
		}
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("turn %d differs:\n%+v\n%+v", n, a, b)
		}
		n++
	}
	if n != convs*turns {
		t.Fatalf("%d turns, want %d", n, convs*turns)
	}
}

// Past its bounds the load generates the rest on the way, and still sends
// every turn once.
func TestPregeneratedLoadBeyondItsBound(t *testing.T) {
	const seed, convs, turns = 9, 3, 50
	var note bytes.Buffer
	w := newWorkload(seed, convs, turns, SizeLarge, "", 1_700_000_000_000)
	// A bound the first turn reaches.
	src := w.sourceWithin(&note, 0, 1)
	seen := map[string]bool{}
	for turn, ok := src(); ok; turn, ok = src() {
		if seen[turn.ID] {
			t.Fatalf("turn %s sent twice", turn.ID)
		}
		seen[turn.ID] = true
	}
	if len(seen) != convs*turns {
		t.Fatalf("%d turns, want %d (%s)", len(seen), convs*turns, note.String())
	}
	if !strings.Contains(note.String(), "load: 1 turns (") {
		t.Fatalf("every turn was generated first despite the bound: %s", note.String())
	}
}
