package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ctxpipe/ctxpipe/internal/openaitest"
	"github.com/ctxpipe/ctxpipe/internal/quality"
	"github.com/ctxpipe/ctxpipe/tokens"
)

// corpus links one real run (and its system prompt) into a temporary
// directory, so the command runs end to end in a second.
func corpus(t *testing.T) string {
	t.Helper()
	src, err := filepath.Abs("../../../shared/data/transcripts")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, f := range []string{"msa_deepseek-chat_django__django-14752.jsonl", "msa_deepseek-chat_django__django-14752.system.txt"} {
		if err := os.Symlink(filepath.Join(src, f), filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestRun(t *testing.T) {
	dir := corpus(t)
	cases := []struct {
		name  string
		args  []string
		check func(t *testing.T, out string)
	}{
		{"markdown", []string{"--format", "markdown"}, func(t *testing.T, out string) {
			lines := strings.Split(strings.TrimSpace(out), "\n")
			var table []string
			for _, l := range lines {
				if strings.HasPrefix(l, "|") {
					table = append(table, l)
				}
			}
			if len(table) != 7 { // heading, rule, five rows
				t.Fatalf("want a markdown table of 7 lines, got:\n%s", out)
			}
			for i, l := range table {
				if n := strings.Count(l, "|"); n != len(columns)+1 {
					t.Fatalf("line %d has %d cells, want %d: %s", i, n-1, len(columns), l)
				}
			}
			for _, s := range []string{"| keep_tail |", "| fresh_start |", "| preserve_fraction |", "| mask only |", "| mask then keep_tail |", "32,000-token window, threshold 70 %"} {
				if !strings.Contains(out, s) {
					t.Fatalf("no %q in:\n%s", s, out)
				}
			}
		}},
		{"json", []string{"--json", "--window", "16000"}, func(t *testing.T, out string) {
			var rep report
			if err := json.Unmarshal([]byte(out), &rep); err != nil {
				t.Fatalf("%v in:\n%s", err, out)
			}
			if rep.Window != 16000 || rep.Transcripts != 1 || len(rep.Rows) != 5 || rep.Condenser != "offline-extractive" {
				t.Fatalf("report %+v", rep)
			}
			if rep.Rows[0].Reductions == 0 || rep.Runs != nil {
				t.Fatalf("keep_tail row %+v (runs only with --detail)", rep.Rows[0])
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			args := append([]string{"--transcripts", dir}, c.args...)
			if code := run(context.Background(), args, &out, &errOut); code != 0 {
				t.Fatalf("exit %d: %s", code, errOut.String())
			}
			if !strings.Contains(errOut.String(), "[  5/5]") {
				t.Fatalf("no progress on stderr: %q", errOut.String())
			}
			c.check(t, out.String())
		})
	}
}

func TestRunRejects(t *testing.T) {
	cases := []struct {
		name string
		args []string
		code int
	}{
		{"bad format", []string{"--format", "html"}, 2},
		{"no window", []string{"--window", "0"}, 2},
		{"no transcripts", []string{"--transcripts", "."}, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			if code := run(context.Background(), c.args, &out, &errOut); code != c.code {
				t.Fatalf("exit %d, want %d; stderr %s", code, c.code, errOut.String())
			}
		})
	}
}

// A retention cell is the median, then the pooled share, and a share short
// of all never reads 100 %.
func TestRetentionCells(t *testing.T) {
	cases := []struct {
		median, pooled quality.Figure
		want           string
	}{
		{quality.Figure{Value: 1, N: 3}, quality.Figure{Value: 1, N: 3}, "100 % / 100 %"},
		{quality.Figure{Value: 1, N: 131}, quality.Figure{Value: 0.99926, N: 131}, "100 % / 99.9 %"},
		{quality.Figure{Value: 0.97, N: 9}, quality.Figure{Value: 0.9544, N: 9}, "97 % / 95 %"},
		{quality.Figure{Value: 0.5, N: 2}, quality.Figure{Value: 0.996, N: 2}, "50 % / 99.6 %"},
		{quality.Figure{}, quality.Figure{}, "–"},
	}
	for _, c := range cases {
		if got := medianPooled(c.median, c.pooled); got != c.want {
			t.Errorf("medianPooled(%v, %v) = %q, want %q", c.median, c.pooled, got, c.want)
		}
	}
}

func TestThousands(t *testing.T) {
	for n, want := range map[int]string{0: "0", 999: "999", 1000: "1,000", 20896: "20,896", 1234567: "1,234,567", -4500: "-4,500"} {
		if got := thousands(n); got != want {
			t.Errorf("thousands(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestRunLLM runs the command against an OpenAI-compatible server (a real
// HTTP server and the real go-openai client) and checks that the summarizer
// tokens in the report are the tokens of the requests the server received.
func TestRunLLM(t *testing.T) {
	srv := openaitest.New(t)
	var out, errOut bytes.Buffer
	args := []string{"--transcripts", corpus(t), "--json", "--quiet", "--base-url", srv.URL(), "--model", "test-model"}
	if code := run(context.Background(), args, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var rep report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Condenser != "test-model at "+srv.URL() {
		t.Fatalf("condenser %q", rep.Condenser)
	}
	calls, sent := 0, 0
	for _, r := range rep.Rows {
		calls += r.SummarizerCalls
		sent += r.SummarizerTokens
	}
	tc, err := tokens.O200K()
	if err != nil {
		t.Fatal(err)
	}
	received := 0
	for _, req := range srv.Requests() {
		for _, m := range req.Chat.Messages {
			received += tc.Count(m.Content)
		}
	}
	if calls == 0 || calls != srv.Count() || sent != received {
		t.Fatalf("report: %d calls, %d tokens; server: %d requests, %d tokens", calls, sent, srv.Count(), received)
	}
}
