package store

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ctxpipe/ctxpipe/schema"
)

// countInFile counts the messages the database file itself holds, without
// its WAL: immutable=1 makes SQLite read the main file alone.
func countInFile(t *testing.T, path string) int {
	t.Helper()
	db, err := sql.Open("sqlite3", dsn(path, "mode=ro&immutable=1"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	err = db.QueryRow("SELECT COUNT(*) FROM messages").Scan(&n)
	if err != nil && strings.Contains(err.Error(), "no such table") {
		return 0 // the migrations are not in the file yet either
	}
	if err != nil && strings.Contains(err.Error(), "malformed") {
		// The checkpointer was writing pages while this read took the
		// file as immutable (no locks): a torn read, not a damaged file.
		// The caller looks again.
		return -1
	}
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// The commits' pages reach the database file without any commit copying
// them: the writer's own checkpoint waits for a WAL far larger than these
// commits make, so only the background checkpointer can have copied them.
func TestCheckpointsBesideTheCommits(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	var auto int
	if err := s.w.QueryRowContext(ctx, "PRAGMA wal_autocheckpoint").Scan(&auto); err != nil {
		t.Fatal(err)
	}
	if auto != backstopPages {
		t.Fatalf("the writer checkpoints at %d pages, want the backstop %d", auto, backstopPages)
	}
	text := strings.Repeat("a turn of some length ", 100)
	const n = 60
	for i := range n {
		commit(t, s, turnEntry("c", msg("c", fmt.Sprintf("m%02d", i), int64(i), schema.RoleUser, text)))
	}
	deadline := time.Now().Add(10 * time.Second)
	// runs counts a checkpoint once it returned: the file may hold the
	// pages a moment before.
	for countInFile(t, s.path) < n || s.ckpt.runs.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s the database file holds %d of %d messages (%d checkpoints ran)",
				countInFile(t, s.path), n, s.ckpt.runs.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if s.ckpt.frames.Load() == 0 {
		t.Fatalf("%d checkpoints found no frames: the file was brought up to date by something else", s.ckpt.runs.Load())
	}
}

// A bulk load has no WAL to copy back: the checkpointer starts when the
// load ends, and the store closes cleanly either way.
func TestCheckpointerStartsAfterBulkLoad(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "bulk.db")
	s, err := Open(ctx, path, WithBulkLoad())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.ckpt != nil {
		t.Fatal("a checkpointer runs during a bulk load")
	}
	commit(t, s, turnEntry("c", msg("c", "a", 1, schema.RoleUser, "hello")))
	if err := s.EndBulkLoad(ctx); err != nil {
		t.Fatal(err)
	}
	if s.ckpt == nil {
		t.Fatal("no checkpointer after the bulk load ended")
	}
	commit(t, s, turnEntry("c", msg("c", "b", 2, schema.RoleUser, "again")))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if got := countInFile(t, path); got != 2 {
		t.Fatalf("the closed file holds %d messages, want 2", got)
	}
}
