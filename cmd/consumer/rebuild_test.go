package main

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ctxpipe/ctxpipe/schema"
)

// consumer --rebuild rebuilds ctxpipe.db from CTX_STATE alone (here the
// embedded server's, restarted from the data dir), proves it identical and
// replaces the file; a file that differs from the changelog is reported and
// kept, with a non-zero exit.
func TestRebuildReplacesAnIdenticalFile(t *testing.T) {
	dir := t.TempDir()
	m := mustRunMain(t, dir)
	c := connectAs(t, m.ns.ClientURL(), "acme-agent")
	rng := rand.New(rand.NewPCG(10, 10))
	var last schema.Turn
	for i := range 20 {
		last = textTurn(rng, "rebuild-me", "demo-16k", i, 1_700_000_000_000+int64(i)*1000, 330)
		c.publishTurn(last)
	}
	c.mustHistory("rebuild-me", schema.ViewEffective, last.ID)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(dir, "ctxpipe.db")

	rebuild := func() (string, error) {
		r := NewMain()
		r.Config.DataDir = dir
		r.Config.Listen = "127.0.0.1:-1"
		r.Log = testLogger(t)
		var out bytes.Buffer
		err := r.RebuildDB(context.Background(), &out)
		t.Logf("rebuild:\n%s", out.String())
		return out.String(), err
	}
	out, err := rebuild()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "identical: ") || !strings.Contains(out, "messages: ") {
		t.Fatalf("no proof in the output")
	}
	if _, err := os.Stat(db + ".replaced"); err != nil {
		t.Fatalf("the old file was not kept: %v", err)
	}

	// Tamper with a tag: the next rebuild must refuse to replace the file.
	conn, err := sql.Open("sqlite3", db)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(`UPDATE messages SET condense_parent = 'forged' WHERE rowid = (SELECT MIN(rowid) FROM messages)`); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	out, err = rebuild()
	if !errors.Is(err, errNotIdentical) || !strings.Contains(out, "condense_parent differs") {
		t.Fatalf("a tampered file: %v", err)
	}
	if _, err := os.Stat(db + ".rebuild"); err != nil {
		t.Fatalf("the rebuilt file was not kept beside the tampered one: %v", err)
	}
}
