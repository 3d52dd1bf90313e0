package pipeline

import (
	"context"
	"sync"
)

// logState is the committer's view of the changelog, owned by its
// goroutine; applied is shared so that the follower skips, without decoding
// them, the records this instance wrote itself.
type logState struct {
	applied   []uint64 // per partition: last CTX_STATE sequence the store reflects
	pieceTail []uint64 // per partition: last piece of an unfinished record after applied
	// pieceHead is, per partition, the first piece of a record not yet
	// complete: the cursor a follower restarts from must not pass it, or
	// the record could never be put together.
	pieceHead []uint64
	cursor    uint64 // every message up to it was handled

	mu     sync.RWMutex
	shared []uint64 // copy of applied for the follower
	// foreign is, per partition, the sequence of the last record of another
	// writer (or of this one, brought in by the follower after its own
	// commit failed) that the store applied. A worker's view of a
	// conversation is stale if it moved while the worker prepared: the
	// fence alone does not tell, since the store has applied that record
	// and the fence moved with it.
	foreign []uint64
	// own holds, per partition, the last record this instance appended
	// and has not committed yet (the round committing, or the next one,
	// already appending): the follower must not fetch it back meanwhile,
	// and the next round's append is fenced after it.
	// inflight marks the partitions this instance is appending to, whose
	// new sequence it does not know yet: the follower may see the message
	// before the append returns. A message of another writer skipped
	// meanwhile is read again, as when an own commit fails (see
	// applyFollowed): this instance's append was then fenced.
	own      []uint64
	inflight []bool
	// reread is, per partition, the last message read again because it
	// was skipped as this instance's own while the store lacks it: up to
	// it, own and inflight no longer make the follower skip a message. A
	// partition just taken over, behind its changelog, has its workers'
	// appends fenced and retried, so an append is nearly always in flight:
	// without the mark, the old owner's record could be skipped again at
	// every read. Delivering a message with its data is always safe: the
	// committer holds it behind a round in flight and applies it only
	// past the store's position.
	reread []uint64
	cur    uint64
	moved  chan struct{} // closed and replaced whenever cursor moves
	// seen is, per partition, the last message the committer handled (a
	// record applied or skipped, a piece, an unreadable message): a
	// partition's copy is current once seen reaches its last message.
	seen []uint64
	// held tells whether this instance follows partition p: only those
	// partitions' unfinished records hold the cursor back.
	held func(p int) bool
}

func newLogState(partitions int, pos map[int]uint64, cursor uint64) *logState {
	ls := &logState{applied: make([]uint64, partitions+1), pieceTail: make([]uint64, partitions+1), pieceHead: make([]uint64, partitions+1),
		shared: make([]uint64, partitions+1), own: make([]uint64, partitions+1), inflight: make([]bool, partitions+1),
		reread:  make([]uint64, partitions+1),
		foreign: make([]uint64, partitions+1), seen: make([]uint64, partitions+1),
		cursor: cursor, cur: cursor, moved: make(chan struct{}), held: func(int) bool { return true }}
	for p, seq := range pos {
		if p >= 0 && p <= partitions {
			ls.applied[p], ls.shared[p] = seq, seq
		}
	}
	return ls
}

// foreignMark is partition p's foreign mark (see logState.foreign). A
// worker reads it before it reads the store for a batch.
func (ls *logState) foreignMark(p int) uint64 {
	ls.mu.RLock()
	defer ls.mu.RUnlock()
	return ls.foreign[p]
}

func (ls *logState) setForeign(p int, seq uint64) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if seq <= ls.foreign[p] {
		return
	}
	ls.foreign[p] = seq
	close(ls.moved)
	ls.moved = make(chan struct{})
}

// waitForeign waits until partition p's foreign mark is no longer mark: the
// follower applied a record of another writer (or this instance's own,
// after its commit failed), and a batch fenced behind it can be prepared
// again.
func (ls *logState) waitForeign(ctx context.Context, p int, mark uint64) error {
	for {
		ls.mu.RLock()
		now, moved := ls.foreign[p], ls.moved
		ls.mu.RUnlock()
		if now != mark {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-moved:
		}
	}
}

// fence is the sequence an append to partition p must find last: what the
// store reflects, or the end of an unfinished record's pieces right after
// it (a writer that died between pieces), or this instance's own record
// appended by the round still committing.
func (ls *logState) fence(p int) uint64 {
	ls.mu.RLock()
	own := ls.own[p]
	ls.mu.RUnlock()
	return max(ls.applied[p], ls.pieceTail[p], own)
}

func (ls *logState) setApplied(p int, seq uint64) {
	if seq <= ls.applied[p] {
		return
	}
	ls.applied[p] = seq
	ls.mu.Lock()
	ls.shared[p] = seq
	close(ls.moved)
	ls.moved = make(chan struct{})
	ls.mu.Unlock()
}

// appliedOf is the last record of partition p the store reflects.
func (ls *logState) appliedOf(p int) uint64 {
	ls.mu.RLock()
	defer ls.mu.RUnlock()
	return ls.shared[p]
}

// setSeen records that the committer handled partition p's messages up to
// seq.
func (ls *logState) setSeen(p int, seq uint64) {
	ls.mu.Lock()
	ls.seen[p] = max(ls.seen[p], seq)
	close(ls.moved)
	ls.moved = make(chan struct{})
	ls.mu.Unlock()
}

// waitSeen waits until the store reflects partition p's changelog up to
// seq: the committer handled it, or committed this instance's own record
// there.
func (ls *logState) waitSeen(ctx context.Context, p int, seq uint64) error {
	for {
		ls.mu.RLock()
		at, moved := max(ls.seen[p], ls.shared[p]), ls.moved
		ls.mu.RUnlock()
		if at >= seq {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-moved:
		}
	}
}

func (ls *logState) setCursor(seq uint64) {
	for p, head := range ls.pieceHead {
		if head > 0 && ls.held(p) {
			seq = min(seq, head-1)
		}
	}
	if seq <= ls.cursor {
		return
	}
	ls.cursor = seq
	ls.mu.Lock()
	ls.cur = seq
	close(ls.moved)
	ls.moved = make(chan struct{})
	ls.mu.Unlock()
}

// safeCursor is where a follower may restart: the cursor, or before the
// first piece of a record still incomplete.
func (ls *logState) safeCursor() uint64 {
	ls.mu.RLock()
	defer ls.mu.RUnlock()
	return ls.cur
}

// has tells the follower whether the store holds p's message seq already,
// or is about to (this instance appended it and is committing it). Up to
// p's reread mark only the store's own position counts: such a message is
// read with its data, and the committer applies it or finds it applied.
func (ls *logState) has(p int, seq uint64) bool {
	ls.mu.RLock()
	defer ls.mu.RUnlock()
	if p < 0 || p >= len(ls.shared) {
		return false
	}
	return seq <= ls.shared[p] || (seq > ls.reread[p] && (seq <= ls.own[p] || ls.inflight[p]))
}

// rereading marks p's message seq as read again (see reread).
func (ls *logState) rereading(p int, seq uint64) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if p >= 0 && p < len(ls.reread) {
		ls.reread[p] = max(ls.reread[p], seq)
	}
}

// appending marks an append to partition p in flight; appended ends it
// with the sequence the append reached (0: it failed). The record is then
// this instance's own while its commit runs; appendDone ends that (the
// commit either landed, and applied covers it, or failed, and the follower
// must read it after all).
func (ls *logState) appending(p int) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.inflight[p] = true
}

func (ls *logState) appended(p int, seq uint64) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.own[p] = max(ls.own[p], seq)
	ls.inflight[p] = false
}

func (ls *logState) appendDone(seqs map[int]uint64) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for p, seq := range seqs {
		// Not a later round's record, appended meanwhile.
		if ls.own[p] <= seq {
			ls.own[p] = 0
		}
	}
}

// holdsAny tells whether the file follows any partition now.
func (ls *logState) holdsAny() bool {
	for p := range ls.applied {
		if ls.held(p) {
			return true
		}
	}
	return false
}
