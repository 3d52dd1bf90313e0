package store

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"
)

// The WAL's pages are copied back into the database file (a checkpoint) by
// a goroutine of its own, on a connection of its own, beside the commits.
// Left to SQLite, the commit that takes the WAL past 1,000 pages copies them
// itself and fsyncs the file before it returns: that commit's inputs wait
// for it, and so does every round queued behind the single writer.
//
// A passive checkpoint takes no lock a writer or a reader waits on, so
// commits go on while it copies. The writer keeps SQLite's own checkpoint
// at a much larger size as a backstop, should this one fall behind or fail.
const (
	// checkpointEvery is how long commits gather in the WAL before they are
	// copied back: a page written by several commits meanwhile is copied
	// once.
	checkpointEvery = 100 * time.Millisecond
	// backstopPages is the WAL size, in pages, at which the writer
	// checkpoints by itself (SQLite's default is 1,000).
	backstopPages = 16384
	// walSizeLimit is what the WAL file is cut back to when it restarts
	// after a burst made it grow.
	walSizeLimit = 64 << 20
)

// checkpointer copies the WAL back while it is kicked.
type checkpointer struct {
	db   *sql.DB
	kick chan struct{}
	stop chan struct{}
	done chan struct{}
	log  *slog.Logger
	// runs and frames count the checkpoints done and the WAL frames they
	// found, for tests and the curious.
	runs, frames atomic.Int64
}

// startCheckpointer opens the checkpointer's connection to the database at
// abs (already in WAL mode) and starts it.
func startCheckpointer(ctx context.Context, abs, busy string, log *slog.Logger) (*checkpointer, error) {
	// synchronous=FULL: the copy is fsynced before the WAL may restart over
	// the frames it copied.
	db, err := sql.Open("sqlite3", dsn(abs, "_synchronous=FULL&_busy_timeout="+busy))
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, err
	}
	c := &checkpointer{db: db, kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		log: log}
	go c.run()
	return c, nil
}

// committed tells the checkpointer the WAL grew. It never blocks.
func (c *checkpointer) committed() {
	if c == nil {
		return
	}
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

func (c *checkpointer) run() {
	defer close(c.done)
	t := time.NewTimer(checkpointEvery)
	t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-c.kick:
		}
		t.Reset(checkpointEvery)
		select {
		case <-c.stop:
			t.Stop()
			return
		case <-t.C:
		}
		if err := c.checkpoint(); err != nil {
			// The writer's backstop checkpoints meanwhile; the next kick
			// tries again.
			c.log.Warn("background checkpoint failed", "err", err)
		}
	}
}

// checkpoint copies whatever the WAL holds that no reader still needs.
func (c *checkpointer) checkpoint() error {
	var busy, frames, copied int
	err := c.db.QueryRowContext(context.Background(), "PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &frames, &copied)
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	c.runs.Add(1)
	c.frames.Add(int64(frames))
	return nil
}

// close stops the checkpointer and closes its connection.
func (c *checkpointer) close() error {
	if c == nil {
		return nil
	}
	close(c.stop)
	<-c.done
	return c.db.Close()
}
