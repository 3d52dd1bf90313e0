package pipeline

import (
	"slices"
	"testing"
	"time"
)

func jobsOf(conv string, seqs ...uint64) []*job {
	out := make([]*job, len(seqs))
	for i, s := range seqs {
		out[i] = &job{conv: conv, seq: s}
	}
	return out
}

func seqsOf(jobs []*job) []uint64 {
	out := make([]uint64, len(jobs))
	for i, j := range jobs {
		out[i] = j.seq
	}
	return out
}

// The scheduler's rules, step by step: a conversation's inputs come out in
// the order they went in, at most max at a time; a conversation a worker
// holds is given to no other until released; conversations are served
// oldest ready first; inputs that arrived while a conversation was held
// make it ready again on release.
func TestSchedulerOrder(t *testing.T) {
	type take struct {
		conv string
		seqs []uint64
	}
	tests := []struct {
		name   string
		pushed []*job
		max    int
		// steps alternate: take (conv, seqs), release releases the last
		// conversation taken when set.
		steps   []take
		release []bool
	}{
		{
			name:    "one conversation, in order, up to max",
			pushed:  jobsOf("a", 1, 2, 3),
			max:     2,
			steps:   []take{{"a", []uint64{1, 2}}, {"a", []uint64{3}}},
			release: []bool{true, true},
		},
		{
			name:    "oldest ready first",
			pushed:  append(append(jobsOf("a", 1), jobsOf("b", 2)...), jobsOf("a", 3)...),
			max:     10,
			steps:   []take{{"a", []uint64{1, 3}}, {"b", []uint64{2}}},
			release: []bool{true, true},
		},
		{
			name:    "a held conversation is skipped",
			pushed:  append(jobsOf("a", 1, 2), jobsOf("b", 3)...),
			max:     1,
			steps:   []take{{"a", []uint64{1}}, {"b", []uint64{3}}, {"a", []uint64{2}}},
			release: []bool{false, true, true},
		},
	}
	for _, tt := range tests {
		s := newScheduler()
		for _, j := range tt.pushed {
			s.push(j)
		}
		var held []string
		for i, want := range tt.steps {
			conv, batch := s.take(tt.max)
			if conv != want.conv || !slices.Equal(seqsOf(batch), want.seqs) {
				t.Errorf("%s: step %d took %s %v, want %s %v", tt.name, i, conv, seqsOf(batch), want.conv, want.seqs)
			}
			held = append(held, conv)
			if tt.release[i] {
				for _, c := range held {
					s.release(c)
				}
				held = nil
			}
		}
	}
}

// Inputs pushed while a worker holds their conversation wait for its
// release, then come out in order; take blocks while nothing is ready, and
// returns nil once the scheduler is closed and empty.
func TestSchedulerHoldAndClose(t *testing.T) {
	s := newScheduler()
	s.push(&job{conv: "a", seq: 1})
	conv, batch := s.take(10)
	if conv != "a" || len(batch) != 1 {
		t.Fatalf("took %s %v", conv, seqsOf(batch))
	}
	s.push(&job{conv: "a", seq: 2})
	s.push(&job{conv: "a", seq: 3})
	got := make(chan []*job, 1)
	go func() {
		_, b := s.take(10)
		got <- b
	}()
	select {
	case b := <-got:
		t.Fatalf("a held conversation was taken again: %v", seqsOf(b))
	case <-time.After(50 * time.Millisecond):
	}
	s.release("a")
	select {
	case b := <-got:
		if !slices.Equal(seqsOf(b), []uint64{2, 3}) {
			t.Fatalf("after release took %v, want [2 3]", seqsOf(b))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("release did not make the conversation ready")
	}
	s.release("a")
	if n := len(s.convs); n != 0 {
		t.Errorf("%d conversations kept after their queues emptied", n)
	}
	// Closed: what is queued still comes out, then take returns nil.
	s.push(&job{conv: "b", seq: 4})
	s.close()
	if conv, b := s.take(10); conv != "b" || len(b) != 1 {
		t.Fatalf("after close took %s %v, want b [4]", conv, seqsOf(b))
	}
	s.release("b")
	if conv, b := s.take(10); b != nil {
		t.Fatalf("closed and empty: took %s %v", conv, seqsOf(b))
	}
}
