package quality

import (
	"slices"
	"testing"

	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/textfacts"
)

const task = "Fix the crash in src/app.py when the key is missing."

// agentRun is a small run: the task, two calls that fail, a fix, a test run.
func agentRun() []schema.Message {
	return []schema.Message{
		msg("u0", schema.RoleUser, text(task)),
		msg("a1", schema.RoleAssistant, text("Reproduce first."), use("c1", "bash", `{"command":"python src/app.py"}`)),
		msg("u1", schema.RoleUser, result("c1", "Traceback (most recent call last):\nKeyError: 'name'", true)),
		msg("a2", schema.RoleAssistant, use("c2", "bash", `{"command":"grep -n name src/config.py"}`)),
		msg("u2", schema.RoleUser, result("c2", "12: name = cfg['name']\nerror: config not loaded", true)),
		msg("a3", schema.RoleAssistant, use("c3", "edit", `{"path":"src/app.py","old":"cfg['name']","new":"cfg.get('name')"}`)),
		msg("u3", schema.RoleUser, result("c3", "edited", false)),
		msg("a4", schema.RoleAssistant, use("c4", "bash", `{"command":"pytest -q"}`)),
		msg("u4", schema.RoleUser, result("c4", "3 passed", false)),
	}
}

func summary(id, s string) schema.Message {
	m := msg(id, schema.RoleAssistant, text(s))
	m.IsSummary = true
	return m
}

func pick(msgs []schema.Message, ids ...string) []schema.Message {
	var out []schema.Message
	for _, id := range ids {
		for _, m := range msgs {
			if m.ID == id {
				out = append(out, m)
			}
		}
	}
	return out
}

func TestMeasure(t *testing.T) {
	run := agentRun()
	all := []string{"u0", "a1", "u1", "a2", "u2", "a3", "u3", "a4", "u4"}
	masked := append([]schema.Message(nil), run...)
	masked[2] = msg("u1", schema.RoleUser, result("c1", "[bash python src/app.py: 40 tokens hidden]", true))
	cases := []struct {
		name   string
		after  []schema.Message
		latest string
		want   Reduction
	}{
		{
			name:  "a summary that names everything",
			after: append(pick(run, "u0"), append([]schema.Message{summary("s", "Ran `python src/app.py`: KeyError: 'name'. Ran grep -n name src/config.py: error: config not loaded. Edited src/app.py.")}, pick(run, "a4", "u4")...)...),
			want: Reduction{Hidden: 6, Paths: Count{2, 2}, Errors: Count{2, 2}, Commands: Count{2, 2},
				LastError: "error: config not loaded", LastErrorKept: true, TaskVerbatim: true, LatestVerbatim: true},
		},
		{
			name:  "a summary that forgets the errors and one command",
			after: append(pick(run, "u0"), append([]schema.Message{summary("s", "Looked at src/config.py, fixed src/app.py with python src/app.py.")}, pick(run, "a4", "u4")...)...),
			want: Reduction{Hidden: 6, Paths: Count{2, 2}, Errors: Count{2, 0}, Commands: Count{2, 1},
				LastError: "error: config not loaded", TaskVerbatim: true, LatestVerbatim: true},
		},
		{
			name:  "fresh start: the task paraphrased is not verbatim",
			after: []schema.Message{summary("s", "The user wants the crash in src/app.py fixed. Last: pytest -q, 3 passed.")},
			want: Reduction{Hidden: 9, Paths: Count{2, 1}, Errors: Count{2, 0}, Commands: Count{3, 1},
				LastError: "error: config not loaded"},
		},
		{
			name:  "a truncation: facts kept only where a kept message repeats them",
			after: pick(run, "u0", "a3", "u3", "a4", "u4"),
			want: Reduction{Hidden: 4, Paths: Count{2, 1}, Errors: Count{2, 0}, Commands: Count{2, 0},
				LastError: "error: config not loaded", TaskVerbatim: true, LatestVerbatim: true},
		},
		{
			name:   "a later instruction lost",
			after:  pick(run, "u0", "a4", "u4"),
			latest: "Now also add a test for the missing key.",
			want: Reduction{Hidden: 7, Paths: Count{2, 1}, Errors: Count{2, 0}, Commands: Count{2, 0},
				LastError: "error: config not loaded", TaskVerbatim: true},
		},
		{
			name:  "a masked result is in the hidden span; its stand-in keeps the command",
			after: masked,
			want: Reduction{Hidden: 1, Paths: Count{0, 0}, Errors: Count{1, 0}, Commands: Count{0, 0},
				LastError: "KeyError: 'name'", TaskVerbatim: true, LatestVerbatim: true},
		},
		{
			name:  "nothing hidden",
			after: pick(run, all...),
			want:  Reduction{TaskVerbatim: true, LatestVerbatim: true},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			latest := c.latest
			before := run
			if latest == "" {
				latest = task
			} else {
				before = append(append([]schema.Message(nil), run...), msg("u5", schema.RoleUser, text(latest)))
			}
			got := Measure(before, c.after, task, latest)
			if got.Hidden != c.want.Hidden || got.Paths != c.want.Paths || got.Errors != c.want.Errors ||
				got.Commands != c.want.Commands || got.LastError != c.want.LastError || got.LastErrorKept != c.want.LastErrorKept ||
				got.TaskVerbatim != c.want.TaskVerbatim || got.LatestVerbatim != c.want.LatestVerbatim {
				t.Fatalf("Measure =\n %+v\nwant\n %+v", got, c.want)
			}
			for _, k := range []Count{got.Paths, got.Errors, got.Commands} {
				if v, ok := k.Share(); ok && (v < 0 || v > 1) {
					t.Fatalf("share %v out of [0,1]", v)
				}
			}
		})
	}
}

// A file of the hidden span counts as kept when the effective history names
// it, or when a summary's or a marker's files-touched list names or covers
// it, braced or grouped; an agent's own text is not such a list.
func TestMeasureFiles(t *testing.T) {
	run := agentRun() // the calls name src/app.py (the kept task does too) and src/config.py
	withSummary := func(s string) []schema.Message {
		return append(pick(run, "u0"), append([]schema.Message{summary("s", s)}, pick(run, "a4", "u4")...)...)
	}
	mark := msg("t", schema.RoleUser, text("[Sliding window truncation: 6 messages hidden to reduce context]\n"+textfacts.MarkerFilesHeading+" src/** (read; 2 files)"))
	mark.IsTruncationMarker = true
	cases := []struct {
		name  string
		after []schema.Message
		want  Count
		lost  []string
	}{
		{"named by nothing", withSummary("Fixed it."), Count{2, 1}, []string{"src/config.py"}},
		{"named verbatim", withSummary("Edited src/app.py after reading src/config.py."), Count{2, 2}, nil},
		{"a list, one per line", withSummary(textfacts.FilesTouchedHeading + "\n- src/app.py (edited)\n- src/config.py (read)"), Count{2, 2}, nil},
		{"a braced list", withSummary(textfacts.FilesTouchedHeading + "\n- src/{app.py,config.py} (read)"), Count{2, 2}, nil},
		{"a group", withSummary(textfacts.FilesTouchedHeading + "\n- src/** (edited; 2 files)"), Count{2, 2}, nil},
		{"another directory's group", withSummary(textfacts.FilesTouchedHeading + "\n- lib/** (edited; 2 files)"), Count{2, 1}, []string{"src/config.py"}},
		{"a marker's group", append(pick(run, "u0"), mark, run[7], run[8]), Count{2, 2}, nil},
		{"a list in the agent's own words is not one", append(pick(run, "u0"), msg("x", schema.RoleUser, text(textfacts.FilesTouchedHeading+"\n- src/** (read; 2 files)")), run[7], run[8]), Count{2, 1}, []string{"src/config.py"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := Measure(run, c.after, task, task)
			if got.Files != c.want || !slices.Equal(got.FilesLost, c.lost) {
				t.Fatalf("files %+v lost %q, want %+v lost %q", got.Files, got.FilesLost, c.want, c.lost)
			}
		})
	}
}

func TestHiddenSpan(t *testing.T) {
	run := agentRun()
	after := pick(run, "u0", "a4", "u4")
	after[2] = msg("u4", schema.RoleUser, result("c4", "[pytest -q: 3 tokens hidden]", false))
	var got []string
	for _, m := range HiddenSpan(run, after) {
		got = append(got, m.ID)
	}
	want := []string{"a1", "u1", "a2", "u2", "a3", "u3", "u4"}
	if !slices.Equal(got, want) {
		t.Fatalf("hidden span %v, want %v", got, want)
	}
}

func TestBrokenToolPairs(t *testing.T) {
	run := agentRun()
	tagged := func(m schema.Message) schema.Message { m.CondenseParent = "s"; return m }
	// orphan: u2 is stored untagged, but its call a2 is hidden, so the
	// effective history drops the result.
	orphanFull := append([]schema.Message(nil), run...)
	orphanFull[3] = tagged(orphanFull[3])
	// a truncation that hid u1 and everything after u2, but not a1.
	resultHidden := append([]schema.Message(nil), run...)
	for _, i := range []int{2, 5, 6, 7, 8} {
		resultHidden[i] = tagged(resultHidden[i])
	}
	cases := []struct {
		name      string
		full, eff []schema.Message
		want      []string
	}{
		{"intact", run, run, nil},
		{"hidden together", append(pick(run, "u0"), tagged(run[1]), tagged(run[2])), pick(run, "u0"), nil},
		{"result dropped as an orphan", orphanFull, pick(run, "u0", "a1", "u1", "a3", "u3", "a4", "u4"), []string{"c2"}},
		{"call visible, result hidden", resultHidden, pick(run, "u0", "a1", "a2", "u2"), []string{"c1"}},
		{"pending call is fine", pick(run, "u0", "a1"), pick(run, "u0", "a1"), nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := BrokenToolPairs(c.full, c.eff); !slices.Equal(got, c.want) {
				t.Fatalf("BrokenToolPairs = %v, want %v", got, c.want)
			}
		})
	}
}

func TestMedianAndShare(t *testing.T) {
	cases := []struct {
		in   []float64
		want Figure
	}{
		{nil, Figure{}},
		{[]float64{3}, Figure{3, 1}},
		{[]float64{5, 1, 3}, Figure{3, 3}},
		{[]float64{4, 1, 3, 2}, Figure{2.5, 4}},
	}
	for _, c := range cases {
		if got := Median(c.in); got != c.want {
			t.Errorf("Median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
	if got := Pooled([]Count{{Total: 10, Kept: 5}, {}, {Total: 2, Kept: 2}, {Total: 4, Kept: 4}}); got != (Figure{11.0 / 16, 3}) {
		t.Errorf("Pooled = %v, want 11/16 over 3", got)
	}
	if got := Pooled(nil); got != (Figure{}) {
		t.Errorf("Pooled(nil) = %v", got)
	}
	if got := ShareTrue([]bool{true, false, true, true}); got != (Figure{0.75, 4}) {
		t.Errorf("ShareTrue = %v", got)
	}
	if got := ShareTrue(nil); got != (Figure{}) {
		t.Errorf("ShareTrue(nil) = %v", got)
	}
}
