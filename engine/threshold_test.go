package engine

import (
	"testing"

	"github.com/ctxpipe/ctxpipe/schema"
)

// Decide resolves the profile's threshold as the seeds' table says: -1 or
// absent inherits, 5..100 is used, anything else falls back to the global
// (no clamping) and is flagged for the caller to warn about.
func TestDecideThreshold(t *testing.T) {
	const global = 75
	cases := []struct {
		name    string
		v       *int
		want    int
		ignored bool
	}{
		{"absent inherits", nil, global, false},
		{"-1 inherits", intp(-1), global, false},
		{"min 5 used", intp(5), 5, false},
		{"max 100 used", intp(100), 100, false},
		{"60 used", intp(60), 60, false},
		{"4 falls back", intp(4), global, true},
		{"0 falls back", intp(0), global, true},
		{"101 falls back", intp(101), global, true},
		{"-2 falls back", intp(-2), global, true},
	}
	g := schema.Globals{AutoCondense: true, AutoCondensePercent: global}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := schema.Profile{ID: "p", ContextWindow: 1000, CondenseThreshold: c.v}
			for _, trig := range []schema.Trigger{schema.TriggerAuto, schema.TriggerManual} {
				if d := Decide(500, &p, g, trig, false); d.Threshold != c.want || d.ThresholdIgnored != c.ignored {
					t.Fatalf("%s: threshold = %d, ignored = %v; want %d, %v", trig, d.Threshold, d.ThresholdIgnored, c.want, c.ignored)
				}
			}
		})
	}
}

func TestAllowedTokens(t *testing.T) {
	cases := []struct {
		window, maxTokens int
		want              float64
	}{
		{200000, 4096, 175904}, // the seeds' example
		{200000, 0, 171808},    // max_tokens unset reserves 8192
		{200000, 8192, 171808},
		{128000, 16384, 98816},
	}
	for _, c := range cases {
		p := schema.Profile{ContextWindow: c.window, MaxTokens: c.maxTokens}
		if got := AllowedTokens(&p); got != c.want {
			t.Errorf("AllowedTokens(%d, %d) = %v, want %v", c.window, c.maxTokens, got, c.want)
		}
	}
}

func TestDecide(t *testing.T) {
	// window 100000, max_tokens 10000 → allowed 80000.
	base := schema.Profile{ID: "p", ContextWindow: 100000, MaxTokens: 10000}
	off := base
	off.AutoCondense = boolp(false)
	at60 := base
	at60.CondenseThreshold = intp(60)
	g := schema.Globals{AutoCondense: true, AutoCondensePercent: 75}
	cases := []struct {
		name             string
		prev             int
		p                schema.Profile
		trig             schema.Trigger
		blocked          bool
		condense, trunc  bool
		wantPrev, thresh int
	}{
		{"below threshold", 74999, base, schema.TriggerAuto, false, false, false, 74999, 75},
		{"at threshold", 75000, base, schema.TriggerAuto, false, true, false, 75000, 75},
		{"over allowed", 80001, base, schema.TriggerAuto, false, true, true, 80001, 75},
		{"exactly allowed is not over", 80000, base, schema.TriggerAuto, false, true, false, 80000, 75},
		{"profile threshold 60", 60000, at60, schema.TriggerAuto, false, true, false, 60000, 60},
		{"auto off below allowed", 79000, off, schema.TriggerAuto, false, false, false, 79000, 75},
		{"auto off over allowed truncates", 90000, off, schema.TriggerAuto, false, false, true, 90000, 75},
		{"latch: only truncate", 90000, base, schema.TriggerAuto, true, false, true, 90000, 75},
		{"latch below allowed: nothing", 76000, base, schema.TriggerAuto, true, false, false, 76000, 75},
		{"manual ignores threshold", 10, base, schema.TriggerManual, false, true, false, 10, 75},
		{"manual ignores latch", 10, base, schema.TriggerManual, true, true, false, 10, 75},
		{"forced counts the whole window", 1000, base, schema.TriggerForced, false, true, true, 100000, 75},
		{"forced condenses with auto off", 1000, off, schema.TriggerForced, false, true, true, 100000, 75},
		{"forced uses the profile threshold", 1000, at60, schema.TriggerForced, false, true, true, 100000, 60},
		{"forced after a failure only truncates", 1000, base, schema.TriggerForced, true, false, true, 100000, 75},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := Decide(c.prev, &c.p, g, c.trig, c.blocked)
			if d.Condense != c.condense || d.Truncate != c.trunc {
				t.Fatalf("condense=%v truncate=%v, want %v %v (%+v)", d.Condense, d.Truncate, c.condense, c.trunc, d)
			}
			if d.Prev != c.wantPrev || d.Threshold != c.thresh {
				t.Fatalf("prev=%d threshold=%d, want %d %d", d.Prev, d.Threshold, c.wantPrev, c.thresh)
			}
		})
	}
}

func TestWillManage(t *testing.T) {
	p := schema.Profile{ID: "p", ContextWindow: 200000, MaxTokens: 4096}
	g := schema.Globals{AutoCondense: true, AutoCondensePercent: 75}
	if WillManage(140000+500-1, &p, g) {
		t.Fatal("below 75% and under allowed: nothing to manage")
	}
	if !WillManage(150000, &p, g) {
		t.Fatal("75%: a condense is coming")
	}
	g.AutoCondense = false
	if WillManage(150000, &p, g) {
		t.Fatal("auto-condense off and under allowed: nothing to manage")
	}
	if !WillManage(175905, &p, g) {
		t.Fatal("over allowed: a truncation is coming even with auto-condense off")
	}
}
