package pipeline_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3"

	"github.com/ctxpipe/ctxpipe/pipeline"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/store"
)

// lockDB holds SQLite's write lock from a second connection, as another
// process or a checkpoint would, until release is called.
func lockDB(t *testing.T, path string) (release func()) {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+path+"?_busy_timeout=5000")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(context.Background(), "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	return func() {
		_, _ = conn.ExecContext(context.Background(), "ROLLBACK")
		_ = conn.Close()
		_ = db.Close()
	}
}

func TestTransientFailureIsRetriedInTheLane(t *testing.T) {
	// A 20 ms busy timeout makes a held write lock surface as SQLITE_BUSY at
	// once; the lane must retry with backoff (nothing acked meanwhile) and
	// apply everything, in order, once the lock is gone.
	h := startStore(t, pipeline.Config{Lanes: 2, AckWait: 5 * time.Second, MaxDeliver: 5, RetryBudget: 30 * time.Second},
		[]store.Option{store.WithBusyTimeout(20 * time.Millisecond)})
	release := lockDB(t, h.store.Path())
	var turns []schema.Turn
	for i := 0; i < 6; i++ {
		role := schema.RoleUser
		if i%2 == 1 {
			role = schema.RoleAssistant
		}
		turns = append(turns, h.turn("busy", role, 20))
	}
	// Wait until the runner has failed at least twice, then let go.
	deadline := time.Now().Add(10 * time.Second)
	for h.metrics.Value("ctxpipe_retries_total", "") < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the runner never hit the held lock")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, _, found, _ := h.store.InputStatus(context.Background(), turns[0].ID); found {
		t.Fatal("an input was stored while the database was locked")
	}
	release()
	full := h.history("busy", schema.ViewFull, turns[len(turns)-1].ID)
	if len(full) != len(turns) {
		t.Fatalf("%d of %d turns stored", len(full), len(turns))
	}
	for i := range turns {
		if full[i].ID != turns[i].ID {
			t.Fatalf("turn %d out of order", i)
		}
	}
	if n := h.metrics.Value("ctxpipe_inputs_total", `outcome="rejected"`); n != 0 {
		t.Fatalf("%v inputs rejected; a transient failure must not reject", n)
	}
}

func TestTransientFailureBeyondBudgetIsNotLost(t *testing.T) {
	// The lock outlasts the retry budget: the store fails, not the input,
	// which is not rejected as poison. It must be kept and retried, not
	// given back to JetStream:
	// given back, it came back behind its conversation's later inputs
	// (seen after a NATS node loss, as an orphan tool result). Nothing is
	// lost, nothing is rejected, nothing is reordered.
	h := startStore(t, pipeline.Config{Lanes: 1, AckWait: 5 * time.Second, MaxDeliver: 10, RetryBudget: 200 * time.Millisecond},
		[]store.Option{store.WithBusyTimeout(20 * time.Millisecond)})
	release := lockDB(t, h.store.Path())
	t1 := h.turn("budget", schema.RoleUser, 20)
	deadline := time.Now().Add(10 * time.Second)
	// Past the budget: the retries go on.
	for h.metrics.Value("ctxpipe_retries_total", "") < 6 {
		if time.Now().After(deadline) {
			t.Fatal("the runner stopped retrying the input")
		}
		time.Sleep(10 * time.Millisecond)
	}
	t2 := h.turn("budget", schema.RoleAssistant, 20)
	time.Sleep(300 * time.Millisecond)
	release()
	full := h.history("budget", schema.ViewFull, t2.ID)
	if len(full) != 2 || full[0].ID != t1.ID || full[1].ID != t2.ID {
		t.Fatalf("history %d messages, want %s then %s", len(full), t1.ID, t2.ID)
	}
	if n := h.metrics.Value("ctxpipe_redeliveries_total", ""); n != 0 {
		t.Fatalf("%v redeliveries: the input was given back", n)
	}
	if n := h.metrics.Value("ctxpipe_inputs_total", `outcome="rejected"`); n != 0 {
		t.Fatalf("%v inputs rejected; a failing store must not reject", n)
	}
}
