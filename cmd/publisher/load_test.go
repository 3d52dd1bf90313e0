package main

import (
	"bytes"
	"context"
	"regexp"
	"strconv"
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
