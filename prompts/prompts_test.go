package prompts

import (
	"strings"
	"testing"

	"github.com/ctxpipe/ctxpipe/schema"
)

func TestTextsPresent(t *testing.T) {
	texts := map[string]string{
		"Detailed": Detailed, "Snapshot": Snapshot, "FinalInstruction": FinalInstruction,
		"SnapshotFinalInstruction": SnapshotFinalInstruction, "ToolDeferred": ToolDeferred,
		"SyntheticReasoning": SyntheticReasoning, "SummaryAck": SummaryAck,
	}
	for name, text := range texts {
		if strings.TrimSpace(text) == "" || text != strings.TrimSpace(text) {
			t.Errorf("%s is empty or untrimmed: %q", name, text)
		}
	}
	for _, h := range DetailedSections {
		if !strings.Contains(Detailed, "## "+h+"\n") {
			t.Errorf("Detailed lacks heading %q", h)
		}
	}
	for _, tag := range []string{"state_snapshot", "overall_goal", "key_knowledge", "file_system_state", "recent_actions", "current_plan"} {
		if !strings.Contains(Snapshot, "<"+tag+">") || !strings.Contains(Snapshot, "</"+tag+">") {
			t.Errorf("Snapshot lacks <%s>", tag)
		}
	}
}

func TestFor(t *testing.T) {
	tests := []struct {
		strategy          schema.Strategy
		custom            string
		wantPrompt, final string
	}{
		{schema.StrategyKeepTail, "", Detailed, FinalInstruction},
		{schema.StrategyFreshStart, "", Detailed, FinalInstruction},
		{"", "", Detailed, FinalInstruction},
		{schema.StrategyPreserveFraction, "", Snapshot, SnapshotFinalInstruction},
		{schema.StrategyPreserveFraction, "  \n\t ", Snapshot, SnapshotFinalInstruction},
		{schema.StrategyKeepTail, "  Summarize tersely.\n", "Summarize tersely.", FinalInstruction},
		{schema.StrategyPreserveFraction, "Mine.", "Mine.", FinalInstruction},
	}
	for _, tt := range tests {
		p, f := For(tt.strategy, tt.custom)
		if p != tt.wantPrompt || f != tt.final {
			t.Errorf("For(%q, %q) = (%.30q, %.30q), want (%.30q, %.30q)", tt.strategy, tt.custom, p, f, tt.wantPrompt, tt.final)
		}
	}
}

func TestIsFinalInstruction(t *testing.T) {
	tests := []struct {
		text string
		want bool
	}{
		{FinalInstruction, true},
		{"\n" + SnapshotFinalInstruction + "  ", true},
		{"please continue", false},
		{"", false},
	}
	for _, tt := range tests {
		if got := IsFinalInstruction(tt.text); got != tt.want {
			t.Errorf("IsFinalInstruction(%q) = %v", tt.text, got)
		}
	}
}
