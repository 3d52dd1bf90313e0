package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ctxpipe/ctxpipe/internal/natstest"
	"github.com/ctxpipe/ctxpipe/pipeline"
)

// A second instance on the same consumer is refused with a clear error
// instead of deleting the first one's consumer when it resumes (issue 14);
// once the first stops, it may start.
func TestSecondInstanceIsRefused(t *testing.T) {
	_, url := natstest.Run(t)
	for _, k := range llmEnv {
		t.Setenv(k, "")
	}
	run := func(dir string) (*testMain, error) {
		m := &testMain{Main: NewMain()}
		m.Config.DataDir = dir
		m.Config.NATS.URL = url
		m.Config.HTTP = ""
		m.Log = testLogger(t)
		err := m.Run(context.Background())
		if err != nil {
			_ = m.Close()
			return nil, err
		}
		t.Cleanup(func() { _ = m.Close() })
		return m, nil
	}
	first, err := run(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	_, err = run(t.TempDir())
	if !errors.Is(err, pipeline.ErrLockHeld) || !strings.Contains(err.Error(), "data dir") {
		t.Fatalf("second instance: %v, want a refusal naming the holder", err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		ok, why := first.Ready()
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the first instance is not consuming: %s", why)
		}
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t.TempDir()); err != nil {
		t.Fatalf("after the first stopped: %v", err)
	}
}
