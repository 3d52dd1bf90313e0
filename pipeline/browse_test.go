package pipeline

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	"github.com/ctxpipe/ctxpipe/schema"
)

// Gathering lists: a partition is missing until some instance answers for
// it; a conversation two instances sent (an owner handing over) is listed
// once, as last changed; the list is in key order.
func TestMergeLists(t *testing.T) {
	conv := func(key string, at int64) ConversationSummary {
		return ConversationSummary{Key: key, UpdatedAt: at, State: schema.ConversationState{Messages: int(at)}}
	}
	tests := []struct {
		name      string
		replies   []listReply
		wantKeys  []string
		wantAt    map[string]int64
		missing   []int
		truncated bool
	}{
		{name: "nobody answered", missing: []int{0, 1, 2, 3}},
		{
			name: "every partition answered once",
			replies: []listReply{
				{Partitions: []int{0, 2}, Conversations: []ConversationSummary{conv("b", 1), conv("a", 2)}},
				{Partitions: []int{1, 3}, Conversations: []ConversationSummary{conv("c", 3)}},
			},
			wantKeys: []string{"a", "b", "c"},
		},
		{
			name: "an instance silent: its partitions are named",
			replies: []listReply{
				{Partitions: []int{0, 2}, Conversations: []ConversationSummary{conv("a", 2)}},
			},
			wantKeys: []string{"a"},
			missing:  []int{1, 3},
		},
		{
			name: "a handover: both sent it, the newer wins",
			replies: []listReply{
				{Partitions: []int{0, 1}, Conversations: []ConversationSummary{conv("a", 5)}},
				{Partitions: []int{1, 2, 3}, Conversations: []ConversationSummary{conv("a", 7)}, Truncated: true},
			},
			wantKeys:  []string{"a"},
			wantAt:    map[string]int64{"a": 7},
			truncated: true,
		},
		{
			name:     "a partition out of range is ignored",
			replies:  []listReply{{Partitions: []int{0, 1, 2, 3, 9, -1}}},
			wantKeys: nil,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := mergeLists(tt.replies, 3)
			var keys []string
			for _, c := range got.Conversations {
				keys = append(keys, c.Key)
				if at, ok := tt.wantAt[c.Key]; ok && c.UpdatedAt != at {
					t.Errorf("%s updated at %d, want %d", c.Key, c.UpdatedAt, at)
				}
			}
			if !slices.Equal(keys, tt.wantKeys) || !slices.Equal(got.Missing, tt.missing) || got.Truncated != tt.truncated {
				t.Errorf("got keys %v missing %v truncated %v, want %v %v %v", keys, got.Missing, got.Truncated, tt.wantKeys, tt.missing, tt.truncated)
			}
			if covers(tt.replies, 3) != (len(tt.missing) == 0) {
				t.Errorf("covers = %v with %v missing", covers(tt.replies, 3), tt.missing)
			}
		})
	}
}

// An instance whose list does not fit in one message sends the most
// recently changed conversations that fit, in key order, and says so; one
// that fits is sent whole.
func TestFitList(t *testing.T) {
	rep := listReply{Instance: "i1", Partitions: []int{0}}
	for i := range 100 {
		rep.Conversations = append(rep.Conversations, ConversationSummary{Key: fmt.Sprintf("acme.c%03d", i), UpdatedAt: int64(i)})
	}
	whole, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name  string
		limit int
		keep  int // how many of the newest are kept; -1: all, not truncated
	}{
		{"no bound", 0, -1},
		{"fits", len(whole), -1},
		{"a third fits", len(whole) / 3, 0},
		{"nothing fits", 10, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b, err := fitList(rep, tt.limit)
			if err != nil {
				t.Fatal(err)
			}
			var got listReply
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			if tt.keep == -1 {
				if got.Truncated || len(got.Conversations) != 100 {
					t.Fatalf("%d conversations, truncated %v; want all 100", len(got.Conversations), got.Truncated)
				}
				return
			}
			if !got.Truncated || (tt.limit > 100 && len(b) > tt.limit) {
				t.Fatalf("%d bytes, truncated %v; want at most %d, truncated", len(b), got.Truncated, tt.limit)
			}
			n := len(got.Conversations)
			if tt.limit > 1000 && (n == 0 || n == 100) {
				t.Fatalf("%d conversations kept", n)
			}
			for i, c := range got.Conversations {
				// The newest n, in key order: c(100-n) .. c099.
				if want := fmt.Sprintf("acme.c%03d", 100-n+i); c.Key != want {
					t.Fatalf("conversation %d is %s, want %s", i, c.Key, want)
				}
			}
			if len(got.Partitions) != 1 {
				t.Fatalf("partitions %v lost", got.Partitions)
			}
		})
	}
}
