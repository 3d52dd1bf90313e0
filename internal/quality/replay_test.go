package quality

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/ctxpipe/ctxpipe/condense"
	"github.com/ctxpipe/ctxpipe/internal/transcripts"
	"github.com/ctxpipe/ctxpipe/schema"
)

const transcriptDir = "../../../shared/data/transcripts"

// twoRuns are two real agent runs long enough to be reduced in a 32k window
// under every strategy, and short enough for a test under -race.
var twoRuns = []string{
	"msa_deepseek-chat_astropy__astropy-12907",
	"msa_deepseek-chat_django__django-14752",
}

// loadTwo reads the two runs with ReadTranscript and checks that it sees the
// same turns as internal/transcripts, the reader the other tests use.
func loadTwo(t *testing.T) []Transcript {
	t.Helper()
	var out []Transcript
	for _, name := range twoRuns {
		file := filepath.Join(transcriptDir, name+".jsonl")
		tr, err := ReadTranscript(file)
		if err != nil {
			t.Fatal(err)
		}
		lines := transcripts.Read(t, file)
		if len(lines) != len(tr.Turns) {
			t.Fatalf("%s: %d turns, internal/transcripts reads %d", name, len(tr.Turns), len(lines))
		}
		for i := range lines {
			if lines[i].Turn.ID != tr.Turns[i].ID {
				t.Fatalf("%s turn %d: id %s, internal/transcripts reads %s", name, i, tr.Turns[i].ID, lines[i].Turn.ID)
			}
		}
		if tr.System == "" {
			t.Fatalf("%s: no system prompt read", name)
		}
		out = append(out, tr)
	}
	return out
}

func TestReplayRealRuns(t *testing.T) {
	ts := loadTwo(t)
	rows := Rows()
	base := BaseProfile(32000, 70)
	ctx := context.Background()
	runs, err := ReplayAll(ctx, ts, rows, base, &condense.Offline{}, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	for ri, row := range rows {
		reductions := 0
		for ti, run := range runs[ri] {
			if run.Row != row.Name || run.Transcript != ts[ti].Name {
				t.Fatalf("run [%d][%d] is %s/%s: results out of place", ri, ti, run.Row, run.Transcript)
			}
			if run.Turns != len(ts[ti].Turns) || run.Rejected != 0 {
				t.Fatalf("%s/%s: %d turns, %d rejected", row.Name, run.Transcript, run.Turns, run.Rejected)
			}
			for _, r := range run.Reductions {
				reductions++
				if !r.Shrunk() {
					t.Errorf("%s/%s turn %d %v: context %d → %d did not shrink", row.Name, run.Transcript, r.Turn, r.Events, r.TokensBefore, r.TokensAfter)
				}
				if r.Hidden == 0 {
					t.Errorf("%s/%s turn %d: a reduction that hid nothing", row.Name, run.Transcript, r.Turn)
				}
				for kind, c := range map[string]Count{"paths": r.Paths, "errors": r.Errors, "commands": r.Commands} {
					v, ok := c.Share()
					if c.Kept < 0 || c.Kept > c.Total || ok && (v < 0 || v > 1) {
						t.Errorf("%s/%s turn %d: %s %+v out of range", row.Name, run.Transcript, r.Turn, kind, c)
					}
				}
				if row.Name == "keep_tail" && !r.TaskVerbatim {
					t.Errorf("keep_tail keeps the first message, yet the task is gone at %s turn %d", run.Transcript, r.Turn)
				}
			}
		}
		if reductions == 0 {
			t.Errorf("%s: no reduction in two long runs under a 32k window", row.Name)
		}
		s := Summarize(row.Name, runs[ri])
		if s.Reductions != reductions || s.NotShrunk != 0 {
			t.Errorf("%s: stats %d reductions (%d not shrunk), runs have %d", row.Name, s.Reductions, s.NotShrunk, reductions)
		}
		if row.Name == "keep_tail" && (s.SummarizerCalls == 0 || s.SummarizerTokens <= 0) {
			t.Errorf("keep_tail: %d summarizer calls, %d tokens", s.SummarizerCalls, s.SummarizerTokens)
		}
	}

	// What must survive does in every row, no tool result goes missing,
	// masking rows mask, and masking first halves what the summarizer
	// reads.
	stats := map[string]Stats{}
	for ri, row := range rows {
		stats[row.Name] = Summarize(row.Name, runs[ri])
		for _, run := range runs[ri] {
			if len(run.MissingToolResults) > 0 {
				t.Errorf("%s/%s: tool results missing %v", row.Name, run.Transcript, run.MissingToolResults)
			}
			for _, r := range run.Reductions {
				if !r.TaskVerbatim || !r.LatestVerbatim {
					t.Errorf("%s/%s turn %d: task verbatim %v, latest instruction verbatim %v", row.Name, run.Transcript, r.Turn, r.TaskVerbatim, r.LatestVerbatim)
				}
			}
		}
	}
	if s := stats["mask only"]; s.SummarizerCalls != 0 || s.Events[string(schema.EventToolResultsMasked)] == 0 {
		t.Errorf("mask only: %d summarizer calls, events %v", s.SummarizerCalls, s.Events)
	}
	mk, kt := stats["mask then keep_tail"], stats["keep_tail"]
	if mk.Events[string(schema.EventToolResultsMasked)] == 0 || mk.SummarizerTokens*10 > kt.SummarizerTokens*6 {
		t.Errorf("mask then keep_tail: %d summarizer tokens (keep_tail %d), events %v", mk.SummarizerTokens, kt.SummarizerTokens, mk.Events)
	}

	// The parallel result is the serial one: no figure depends on scheduling.
	for ri, row := range rows {
		for ti, tr := range ts {
			p := base
			row.Configure(&p)
			serial, err := Replay(ctx, tr, row.Name, p, &condense.Offline{})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(serial, runs[ri][ti]) {
				t.Errorf("%s/%s: the parallel replay differs from the serial one", row.Name, tr.Name)
			}
		}
	}
}

// TestReplayAllStopsOnCancel: a cancelled context ends the replay with its
// error instead of a partial table.
func TestReplayAllStopsOnCancel(t *testing.T) {
	ts := loadTwo(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	runs, err := ReplayAll(ctx, ts, Rows(), BaseProfile(32000, 70), &condense.Offline{}, 2, nil)
	if !errors.Is(err, context.Canceled) || runs != nil {
		t.Fatalf("ReplayAll after cancel = %v, %v; want nil, context.Canceled", runs, err)
	}
}
