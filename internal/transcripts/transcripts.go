// Package transcripts reads the shared real agent runs
// (../shared/data/transcripts, one Turn per JSON line) for tests and
// benchmarks, which reach them by a path relative to their package.
package transcripts

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ctxpipe/ctxpipe/schema"
)

// Line is one turn of a transcript and its raw JSON line.
type Line struct {
	Turn schema.Turn
	Raw  []byte
}

// Files lists the transcripts under dir; none is a test failure, since the
// tests expect ../shared beside the repo.
func Files(tb testing.TB, dir string) []string {
	tb.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	if len(files) == 0 {
		tb.Fatalf("no transcripts under %s (the tests expect ../shared beside the repo)", dir)
	}
	return files
}

// Read decodes every line of one transcript.
func Read(tb testing.TB, file string) []Line {
	tb.Helper()
	fh, err := os.Open(file)
	if err != nil {
		tb.Fatal(err)
	}
	defer fh.Close()
	var out []Line
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var l Line
		if err := json.Unmarshal(sc.Bytes(), &l.Turn); err != nil {
			tb.Fatalf("%s: %v", filepath.Base(file), err)
		}
		l.Raw = append([]byte(nil), sc.Bytes()...)
		out = append(out, l)
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	return out
}

// All reads every transcript under dir, file by file.
func All(tb testing.TB, dir string) []Line {
	tb.Helper()
	var out []Line
	for _, f := range Files(tb, dir) {
		out = append(out, Read(tb, f)...)
	}
	return out
}

// Run is one transcript as stored messages, named for its file.
type Run struct {
	Name     string
	Messages []schema.Message
}

// Runs reads every transcript under dir as a Run of messages, file by file.
func Runs(tb testing.TB, dir string) []Run {
	tb.Helper()
	var out []Run
	for _, file := range Files(tb, dir) {
		var msgs []schema.Message
		for _, l := range Read(tb, file) {
			msgs = append(msgs, schema.Message{Turn: l.Turn})
		}
		out = append(out, Run{strings.TrimSuffix(filepath.Base(file), ".jsonl"), msgs})
	}
	return out
}
