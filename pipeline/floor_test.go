package pipeline

import (
	"testing"
	"time"
)

// The runner's own ack floor: everything at or below it was applied. A
// rebuild restarts the consumer after it, and a second rebuild before the
// redelivered inputs arrive must not skip what was given back.
func TestAckFloor(t *testing.T) {
	r := &Runner{held: map[*job]struct{}{}, unapplied: map[uint64]struct{}{}, cfg: Config{MaxHeldBytes: 1 << 20}}
	if _, ok := r.ackFloor(); ok {
		t.Fatal("a floor before anything was fetched")
	}
	jobs := map[uint64]*job{}
	for seq := uint64(1); seq <= 20; seq++ {
		jobs[seq] = &job{msg: nil, seq: seq, touched: time.Now()}
		r.maxSeq = max(r.maxSeq, seq)
		r.held[jobs[seq]] = struct{}{}
	}
	floor := func() uint64 {
		f, _ := r.ackFloor()
		return f
	}
	if f := floor(); f != 0 {
		t.Fatalf("floor %d with 1..20 held, want 0", f)
	}
	for seq := uint64(1); seq <= 14; seq++ {
		delete(r.held, jobs[seq]) // acked after their commit
	}
	delete(r.held, jobs[16])
	if f := floor(); f != 14 {
		t.Fatalf("floor %d with 15, 17..20 held, want 14", f)
	}
	// 15 is given back (not applied), the rest applied.
	r.unapplied[15] = struct{}{}
	for seq := uint64(15); seq <= 20; seq++ {
		delete(r.held, jobs[seq])
	}
	if f := floor(); f != 14 {
		t.Fatalf("floor %d with 15 given back, want 14", f)
	}
	r.restartAt(15)
	if f := floor(); f != 14 {
		t.Fatalf("floor %d right after restarting at 15, want 14: a second rebuild would skip 15", f)
	}
}
