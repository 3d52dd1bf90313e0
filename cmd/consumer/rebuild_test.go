package main

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/store"
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

// runSplit runs the service on dataDir with its state split over files
// SQLite files (--store-files), as mustRunMain does otherwise.
func runSplit(t *testing.T, dataDir string, files int) *testMain {
	t.Helper()
	for _, k := range llmEnv {
		t.Setenv(k, "")
	}
	m := &testMain{Main: NewMain()}
	m.Config.DataDir = dataDir
	m.Config.Listen = "127.0.0.1:-1"
	m.Config.HTTP = freeAddr(t)
	m.Config.StoreFiles = files
	m.Log = testLogger(t)
	if err := m.Run(context.Background()); err != nil {
		_ = m.Close()
		t.Fatalf("run: %v", err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// countMessages is how many messages the SQLite file at path holds.
func countMessages(t *testing.T, path string) int {
	t.Helper()
	conn, err := sql.Open("sqlite3", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var n int
	if err := conn.QueryRow(`SELECT COUNT(*) FROM messages`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// consumer --rebuild with the state split over several files (--store-files
// 3) rebuilds every file at once, each from its partitions, proves each
// identical and replaces them all; a missing file is rebuilt from its
// partitions' changelog; a file tampered with fails the rebuild, named, and
// then no file is replaced; a data dir holding more files than
// --store-files says is refused.
func TestRebuildSplitState(t *testing.T) {
	const files = 3
	dir := t.TempDir()
	m := runSplit(t, dir, files)
	n := m.Config.Partitions
	// Two conversations in each file.
	var convs []string
	perFile := map[int]int{}
	for i := 0; len(convs) < 2*files; i++ {
		conv := "split-" + strconv.Itoa(i)
		if f := bus.PartitionOf("acme", conv, n) % files; perFile[f] < 2 {
			perFile[f]++
			convs = append(convs, conv)
		}
	}
	c := connectAs(t, m.ns.ClientURL(), "acme-agent")
	rng := rand.New(rand.NewPCG(11, 11))
	for j, conv := range convs {
		var last schema.Turn
		for i := range 12 {
			last = textTurn(rng, conv, "demo-16k", i, 1_700_000_000_000+int64(j*100+i)*1000, 330)
			c.publishTurn(last)
		}
		c.mustHistory(conv, schema.ViewEffective, last.ID)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	path := func(i int) string { return filepath.Join(dir, store.SetFileName(i)) }
	held := make([]int, files)
	for i := range files {
		if held[i] = countMessages(t, path(i)); held[i] == 0 {
			t.Fatalf("%s holds no message: the test spreads nothing over it", store.SetFileName(i))
		}
	}

	rebuild := func(storeFiles int) (string, error) {
		r := NewMain()
		r.Config.DataDir = dir
		r.Config.Listen = "127.0.0.1:-1"
		r.Config.StoreFiles = storeFiles
		r.Log = testLogger(t)
		var out bytes.Buffer
		err := r.RebuildDB(context.Background(), &out)
		t.Logf("rebuild:\n%s", out.String())
		return out.String(), err
	}
	out, err := rebuild(files)
	if err != nil {
		t.Fatal(err)
	}
	for i := range files {
		name := store.SetFileName(i)
		if !strings.Contains(out, "identical: "+path(i)+" replaced") || !strings.Contains(out, name+": replayed ") ||
			!strings.Contains(out, name+": messages: ") {
			t.Fatalf("no replay or proof of %s in the output", name)
		}
		if _, err := os.Stat(path(i) + ".replaced"); err != nil {
			t.Fatalf("the old %s was not kept: %v", name, err)
		}
		if got := countMessages(t, path(i)); got != held[i] {
			t.Fatalf("%s holds %d messages after the rebuild, %d before", name, got, held[i])
		}
	}
	if !strings.Contains(out, "total: 3 files, ") {
		t.Fatalf("no total in the output")
	}

	// A missing file is rebuilt from all of its partitions' changelog, and
	// holds what the one moved away held.
	moved := filepath.Join(t.TempDir(), "moved.db")
	if err := os.Rename(path(2), moved); err != nil {
		t.Fatal(err)
	}
	if out, err = rebuild(files); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "no "+path(2)+": rebuilding it") || !strings.Contains(out, path(2)+" rebuilt") {
		t.Fatalf("the missing file was not rebuilt")
	}
	report, err := store.Diff(context.Background(), moved, path(2))
	if err != nil {
		t.Fatal(err)
	}
	if !report.Identical() {
		t.Fatalf("the file rebuilt in place of a missing one differs from it:\n%s", report)
	}

	// Tamper with a tag of file 1: the rebuild fails naming that file, and
	// replaces none of the three.
	for i := range files {
		if err := os.Remove(path(i) + ".replaced"); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
	conn, err := sql.Open("sqlite3", path(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(`UPDATE messages SET condense_parent = 'forged' WHERE rowid = (SELECT MIN(rowid) FROM messages)`); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	out, err = rebuild(files)
	if !errors.Is(err, errNotIdentical) || !strings.Contains(err.Error(), store.SetFileName(1)+": ") {
		t.Fatalf("a tampered %s: %v", store.SetFileName(1), err)
	}
	for _, i := range []int{0, 2} {
		if strings.Contains(err.Error(), store.SetFileName(i)+": ") {
			t.Fatalf("the error names %s, which is identical: %v", store.SetFileName(i), err)
		}
	}
	if !strings.Contains(out, store.SetFileName(1)+": messages: ") || !strings.Contains(out, "condense_parent differs") {
		t.Fatalf("the difference is not in the output")
	}
	for i := range files {
		if _, err := os.Stat(path(i) + ".replaced"); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s was replaced although file 1 differs: %v", store.SetFileName(i), err)
		}
		if _, err := os.Stat(path(i) + ".rebuild"); err != nil {
			t.Fatalf("the rebuilt %s was not kept beside the current one: %v", store.SetFileName(i), err)
		}
	}

	// Fewer files than the data dir holds: refused, naming the file.
	if _, err := rebuild(2); !errors.Is(err, errBeyondSet) || !strings.Contains(err.Error(), store.SetFileName(2)) {
		t.Fatalf("--store-files 2 on a data dir of 3 files: %v", err)
	}
}
