package engine

import (
	"errors"
	"fmt"
	"testing"

	"github.com/ctxpipe/ctxpipe/schema"
)

const (
	auto   = schema.TriggerAuto
	manual = schema.TriggerManual
	forced = schema.TriggerForced
)

func TestMaskDue(t *testing.T) {
	// Threshold 75 %, allowed 80,000 of a 100,000 window.
	at := func(trig schema.Trigger, prev int) Decision {
		return Decision{Trigger: trig, Prev: prev, Window: 100000, Allowed: 80000, Percent: float64(prev) / 1000, Threshold: 75}
	}
	cases := []struct {
		name  string
		masks bool
		d     Decision
		want  bool
	}{
		{"a profile that does not mask", false, at(manual, 90000), false},
		{"automatic, under the threshold", true, at(auto, 74999), false},
		{"automatic, at the threshold", true, at(auto, 75000), true},
		{"automatic, over allowed under a threshold of 100", true, Decision{Trigger: auto, Prev: 81000, Allowed: 80000, Percent: 81, Threshold: 100}, true},
		{"manual, however small", true, at(manual, 10), true},
		{"forced", true, at(forced, 100000), true},
	}
	for _, c := range cases {
		if got := maskDue(c.masks, c.d); got != c.want {
			t.Errorf("%s: maskDue = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestMaskWorth(t *testing.T) {
	cases := []struct {
		trig          schema.Trigger
		gain, minGain int
		want          bool
	}{
		{auto, 0, 0, false},
		{auto, -5, 0, false},
		{auto, 1, 0, true},
		{auto, 999, 1000, false},
		{auto, 1000, 1000, true},
		{manual, 1, 1000, true},
		{manual, 0, 1000, false},
		{forced, 1, 1000, true},
	}
	for _, c := range cases {
		if got := maskWorth(c.trig, c.gain, c.minGain); got != c.want {
			t.Errorf("maskWorth(%s, gain %d, min %d) = %v, want %v", c.trig, c.gain, c.minGain, got, c.want)
		}
	}
}

func TestAfterMask(t *testing.T) {
	// Threshold 80 %: masking suffices at or under 20 %.
	next := func(percent float64, condense, truncate bool) Decision {
		return Decision{Trigger: auto, Percent: percent, Threshold: 80, Condense: condense, Truncate: truncate}
	}
	cases := []struct {
		name                  string
		next                  Decision
		autoCondense, blocked bool
		goOn, condense        bool
	}{
		{"under the stop fraction: masking suffices", next(20, false, false), true, false, false, false},
		{"just over it: condense now, under the threshold", next(20.5, false, false), true, false, true, true},
		{"over it with auto-condense off: stop", next(50, false, false), false, false, false, false},
		{"over it with condensing blocked: stop", next(50, false, false), true, true, false, false},
		{"still at the threshold: the decision stands", next(85, true, false), true, false, true, true},
		{"over allowed even under the stop fraction: go on", next(10, false, true), true, false, true, false},
		{"over allowed and blocked: truncate", next(95, false, true), true, true, true, false},
	}
	for _, c := range cases {
		d, goOn := afterMask(c.next, c.autoCondense, c.blocked)
		if goOn != c.goOn || goOn && d.Condense != c.condense {
			t.Errorf("%s: goOn = %v, condense = %v; want %v, %v", c.name, goOn, d.Condense, c.goOn, c.condense)
		}
		if d.Truncate != c.next.Truncate || d.Percent != c.next.Percent {
			t.Errorf("%s: afterMask changed more than Condense: %+v", c.name, d)
		}
	}
	if !maskSuffices(next(20, false, false)) || maskSuffices(next(20.01, false, false)) || maskSuffices(next(1, false, true)) {
		t.Error("maskSuffices: the stop fraction is 20 % of a threshold of 80, and never over allowed")
	}
}

func TestCondenseWorth(t *testing.T) {
	cases := []struct {
		trig          schema.Trigger
		gain, minGain int
		want          bool
	}{
		{auto, 999, 1000, false},
		{auto, 1000, 1000, true},
		{auto, 0, 0, true},
		{auto, -1, 0, false},
		{manual, -50, 1000, true},
		{forced, 0, 1000, true},
	}
	for _, c := range cases {
		if got := condenseWorth(c.trig, c.gain, c.minGain); got != c.want {
			t.Errorf("condenseWorth(%s, gain %d, min %d) = %v, want %v", c.trig, c.gain, c.minGain, got, c.want)
		}
	}
}

func TestKeptOverAllowed(t *testing.T) {
	cases := []struct {
		keep, kept int
		allowed    float64
		want       bool
	}{
		{0, 90000, 80000, false}, // nothing must stay: no constraint
		{3, 80000, 80000, false},
		{3, 80001, 80000, true},
		{3, 80001, 0, false}, // a window too small to allow anything: truncation decides
		{1, 10, -5, false},
	}
	for _, c := range cases {
		if got := keptOverAllowed(c.keep, c.kept, c.allowed); got != c.want {
			t.Errorf("keptOverAllowed(%d messages, %d tokens, allowed %v) = %v, want %v", c.keep, c.kept, c.allowed, got, c.want)
		}
	}
}

func TestSummaryFailure(t *testing.T) {
	empty := schema.Errorf(schema.ReasonEmptySummary, "the model wrote nothing")
	cases := []struct {
		name   string
		sum    schema.Summary
		err    error
		reason schema.Reason
		msg    string
		failed bool
	}{
		{"a summary", schema.Summary{Text: "done"}, nil, "", "", false},
		{"a blank summary", schema.Summary{Text: " \n\t"}, nil, schema.ReasonEmptySummary, "the summarizer returned no text", true},
		{"an error", schema.Summary{}, errors.New("502 bad gateway"), schema.ReasonLLMError, "502 bad gateway", true},
		{"an error that says the summary was empty", schema.Summary{Cost: 0.01}, fmt.Errorf("summarize: %w", empty), schema.ReasonEmptySummary, "summarize: " + empty.Error(), true},
		{"an error beside a text", schema.Summary{Text: "partial"}, errors.New("timeout"), schema.ReasonLLMError, "timeout", true},
	}
	for _, c := range cases {
		reason, msg, failed := summaryFailure(c.sum, c.err)
		if reason != c.reason || msg != c.msg || failed != c.failed {
			t.Errorf("%s: summaryFailure = %q, %q, %v; want %q, %q, %v", c.name, reason, msg, failed, c.reason, c.msg, c.failed)
		}
	}
}

func TestLatches(t *testing.T) {
	cases := []struct {
		trig   schema.Trigger
		reason schema.Reason
		want   bool
	}{
		{auto, schema.ReasonLLMError, true},
		{auto, schema.ReasonEmptySummary, true},
		{auto, schema.ReasonContextGrew, true},
		{forced, schema.ReasonContextGrew, true},
		{manual, schema.ReasonLLMError, false},
		{auto, schema.ReasonNotEnoughMessages, false},
		{auto, schema.ReasonCondensedRecently, false},
		{auto, schema.ReasonPinnedOverWindow, false},
	}
	for _, c := range cases {
		if got := latches(c.trig, c.reason); got != c.want {
			t.Errorf("latches(%s, %s) = %v, want %v", c.trig, c.reason, got, c.want)
		}
	}
}
