package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ctxpipe/ctxpipe/internal/natstest"
	"github.com/ctxpipe/ctxpipe/pipeline"
)

// Instances share the partitions, but a name belongs to one process: a
// second process under a running instance's name is refused with a clear
// error naming the holder, while one under another name runs beside it.
func TestSecondInstanceIsRefused(t *testing.T) {
	_, url := natstest.Run(t)
	for _, k := range llmEnv {
		t.Setenv(k, "")
	}
	run := func(name, dir string) (*testMain, error) {
		m := &testMain{Main: NewMain()}
		m.Config.DataDir = dir
		m.Config.Name = name
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
	firstDir := t.TempDir()
	first, err := run("one", firstDir)
	if err != nil {
		t.Fatal(err)
	}
	// Another process on the same data dir, under the same name or another,
	// would share one SQLite file, and would take the name over as if the
	// first had crashed. The data dir's lock refuses it before it touches
	// anything.
	for _, name := range []string{"one", "three"} {
		if _, err := run(name, firstDir); err == nil || !strings.Contains(err.Error(), "in use by another process") {
			t.Fatalf("a second process named %s on the first's data dir: %v, want a refusal", name, err)
		}
	}
	_, err = run("one", t.TempDir())
	if !errors.Is(err, pipeline.ErrLockHeld) || !strings.Contains(err.Error(), "data dir") {
		t.Fatalf("second process named one: %v, want a refusal naming the holder", err)
	}
	second, err := run("two", t.TempDir())
	if err != nil {
		t.Fatalf("an instance under another name: %v", err)
	}
	for _, m := range []*testMain{first, second} {
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			ok, why := m.Ready()
			if ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s is not consuming: %s", m.Config.Name, why)
			}
		}
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := run("one", t.TempDir()); err != nil {
		t.Fatalf("after the first stopped: %v", err)
	}
}

// The data dir's lock file is never followed through a symbolic link: the
// service writes its pid into it, and a link could point at any file.
func TestDataDirLockRefusesALink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(t.TempDir(), "precious")
	if err := os.WriteFile(target, []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dir, "LOCK")); err != nil {
		t.Fatal(err)
	}
	if release, err := lockDataDir(dir); err == nil {
		release()
		t.Fatal("a LOCK that is a link was taken")
	}
	if b, _ := os.ReadFile(target); string(b) != "keep me" {
		t.Fatalf("the link's target was written: %q", b)
	}
	release, err := lockDataDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	release()
}
