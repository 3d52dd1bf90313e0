package main

import (
	"reflect"
	"testing"

	"github.com/ctxpipe/ctxpipe/schema"
)

func TestGenerateTurnsDeterministic(t *testing.T) {
	a := GenerateTurns(42, "conv-a", 60, SizeRealistic)
	b := GenerateTurns(42, "conv-a", 60, SizeRealistic)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("same seed and conversation gave different turns")
	}
	c := GenerateTurns(43, "conv-a", 60, SizeRealistic)
	d := GenerateTurns(42, "conv-b", 60, SizeRealistic)
	if a[0].ID == c[0].ID || a[0].ID == d[0].ID {
		t.Fatal("another seed or conversation gave the same ids")
	}
	// A prefix is stable: m only decides where to stop (and the final turn).
	short := GenerateTurns(42, "conv-a", 20, SizeRealistic)
	if !reflect.DeepEqual(short[:18], a[:18]) {
		t.Fatal("a shorter run is not a prefix of a longer one")
	}
}

func TestGenerateTurnsShape(t *testing.T) {
	tests := []struct {
		size           Size
		minOut, maxOut int // tool_result content bytes
	}{
		{SizeRealistic, 200, 8192},
		{SizeSmall, 50, 2048},
		{SizeLarge, 800, 32768},
	}
	for _, tt := range tests {
		t.Run(string(tt.size), func(t *testing.T) {
			turns := GenerateTurns(7, "shape", 401, tt.size)
			if len(turns) != 401 {
				t.Fatalf("%d turns", len(turns))
			}
			ids := map[string]bool{}
			var prev int64
			var toolUses, toolResults, errs, reasoning int
			pending := map[string]bool{}
			for i, tu := range turns {
				if err := tu.Validate(); err != nil {
					t.Fatalf("turn %d invalid: %v", i, err)
				}
				if ids[tu.ID] || tu.TS <= prev || tu.ConversationID != "shape" {
					t.Fatalf("turn %d: id repeated, ts not increasing or wrong conversation", i)
				}
				ids[tu.ID], prev = true, tu.TS
				want := schema.RoleUser
				if i%2 == 1 {
					want = schema.RoleAssistant
				}
				if tu.Role != want {
					t.Fatalf("turn %d role %s, want %s (roles alternate from user)", i, tu.Role, want)
				}
				if i == 0 && tt.size == SizeRealistic {
					if n := len(tu.Content.Text); n < 100 || n > 800 {
						t.Errorf("request is %d bytes", n)
					}
				}
				for _, b := range tu.Content.Blocks {
					switch b.Type {
					case schema.BlockToolUse:
						toolUses++
						pending[b.ID] = true
						if len(b.Input) < 2 || b.Input[0] != '{' {
							t.Errorf("turn %d: tool input %s", i, b.Input)
						}
					case schema.BlockToolResult:
						toolResults++
						if !pending[b.ToolUseID] {
							t.Fatalf("turn %d: result for unknown or answered call %s", i, b.ToolUseID)
						}
						delete(pending, b.ToolUseID)
						if n := len(b.Content.Text); n < tt.minOut || n > tt.maxOut {
							t.Errorf("turn %d: tool output %d bytes, want %d..%d", i, n, tt.minOut, tt.maxOut)
						}
						if b.IsError {
							errs++
						}
					case schema.BlockReasoning:
						reasoning++
					}
				}
				if tu.Role == schema.RoleAssistant && i > 1 && len(pending) == 0 && i != len(turns)-1 {
					t.Fatalf("turn %d: assistant turn without a tool call", i)
				}
			}
			last := turns[len(turns)-1]
			if last.Role != schema.RoleUser && last.Content.IsBlocks {
				t.Errorf("final assistant turn is not a text answer")
			}
			if toolUses < 200 || toolResults != toolUses || errs == 0 || errs > toolResults/4 || reasoning == 0 {
				t.Errorf("tool uses %d, results %d, errors %d, reasoning %d", toolUses, toolResults, errs, reasoning)
			}
		})
	}
}

func TestWorkloadInterleaves(t *testing.T) {
	w := newWorkload(9, 4, 25, SizeSmall, "p", GenEpoch)
	var order []string
	last := map[string]int64{}
	n := 0
	for {
		tu, ok := w.next()
		if !ok {
			break
		}
		n++
		if tu.TS <= last[tu.ConversationID] || tu.ProfileID != "p" {
			t.Fatalf("conversation %s out of order or without profile", tu.ConversationID)
		}
		last[tu.ConversationID] = tu.TS
		order = append(order, tu.ConversationID)
		if w.isLast(&tu) != (countOf(order, tu.ConversationID) == 25) {
			t.Fatalf("isLast wrong for turn %d of %s", countOf(order, tu.ConversationID), tu.ConversationID)
		}
	}
	if n != 100 || len(last) != 4 {
		t.Fatalf("%d turns over %d conversations", n, len(last))
	}
	switches := 0
	for i := 1; i < len(order); i++ {
		if order[i] != order[i-1] {
			switches++
		}
	}
	if switches < 30 {
		t.Errorf("only %d switches between conversations: not interleaved", switches)
	}
}

func countOf(xs []string, x string) int {
	n := 0
	for _, s := range xs {
		if s == x {
			n++
		}
	}
	return n
}

func BenchmarkGenerateTurns(b *testing.B) {
	bytes := 0
	for i := 0; i < b.N; i++ {
		for _, t := range GenerateTurns(int64(i), "bench", 100, SizeRealistic) {
			data, _ := schema.Marshal(t)
			bytes += len(data)
		}
	}
	b.SetBytes(int64(bytes / max(b.N, 1)))
}
