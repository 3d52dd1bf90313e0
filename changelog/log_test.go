package changelog_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/changelog"
	"github.com/ctxpipe/ctxpipe/internal/natstest"
	"github.com/ctxpipe/ctxpipe/store"
)

func piece(k int) nats.Header {
	return nats.Header{changelog.PieceHeader: []string{strconv.Itoa(k)}}
}

func last(n int) nats.Header {
	return nats.Header{changelog.PiecesHeader: []string{strconv.Itoa(n)}}
}

// The Assembler puts a record's pieces back together per partition, even
// when the pieces of two partitions interleave, drops a run a writer
// abandoned when the next record starts, and refuses pieces out of order.
func TestAssemblerPieces(t *testing.T) {
	type msg struct {
		p    int
		h    nats.Header
		data string
	}
	for _, tc := range []struct {
		name    string
		msgs    []msg
		records map[int][]string // per partition, in order
		errs    int
	}{
		{name: "whole records", msgs: []msg{{1, last(1), "a"}, {2, last(1), "b"}, {1, last(1), "c"}},
			records: map[int][]string{1: {"a", "c"}, 2: {"b"}}},
		{name: "pieces in order", msgs: []msg{{1, piece(1), "ab"}, {1, piece(2), "cd"}, {1, last(3), "e"}},
			records: map[int][]string{1: {"abcde"}}},
		{name: "two partitions interleaved", msgs: []msg{{1, piece(1), "a1"}, {2, piece(1), "b1"}, {1, last(2), "a2"},
			{2, piece(2), "b2"}, {2, last(3), "b3"}},
			records: map[int][]string{1: {"a1a2"}, 2: {"b1b2b3"}}},
		{name: "an abandoned run, then a whole record", msgs: []msg{{1, piece(1), "x"}, {1, piece(2), "y"}, {1, last(1), "z"}},
			records: map[int][]string{1: {"z"}}},
		{name: "an abandoned run, then a new run", msgs: []msg{{1, piece(1), "x"}, {1, piece(1), "a"}, {1, last(2), "b"}},
			records: map[int][]string{1: {"ab"}}},
		{name: "a piece out of order", msgs: []msg{{1, piece(1), "a"}, {1, piece(3), "c"}, {1, last(3), "d"}, {1, last(1), "e"}},
			records: map[int][]string{1: {"e"}}, errs: 2},
		{name: "the last piece counts more than came", msgs: []msg{{1, piece(1), "a"}, {1, last(3), "c"}},
			errs: 1},
		{name: "no header", msgs: []msg{{1, nats.Header{}, "a"}, {1, last(1), "b"}},
			records: map[int][]string{1: {"b"}}, errs: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := changelog.NewAssembler()
			got := map[int][]string{}
			errs := 0
			for _, m := range tc.msgs {
				rec, complete, err := a.Add(m.p, m.h, []byte(m.data))
				switch {
				case err != nil:
					errs++
				case complete:
					got[m.p] = append(got[m.p], string(rec))
				}
			}
			if errs != tc.errs || len(got) != len(tc.records) {
				t.Fatalf("records %v with %d errors, want %v with %d", got, errs, tc.records, tc.errs)
			}
			for p, want := range tc.records {
				if len(got[p]) != len(want) {
					t.Fatalf("partition %d: %v, want %v", p, got[p], want)
				}
				for i := range want {
					if got[p][i] != want[i] {
						t.Fatalf("partition %d: %v, want %v", p, got[p], want)
					}
				}
			}
		})
	}
}

func startState(t *testing.T) jetstream.JetStream {
	t.Helper()
	_, url := natstest.Run(t)
	js, err := jetstream.New(natstest.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	if err := bus.EnsureStreams(context.Background(), js); err != nil {
		t.Fatal(err)
	}
	return js
}

// Append's fence: a write that expects the partition where it is appends
// (cut into pieces when it is large); one that expects an older position
// is refused with ErrFenced, and leaves nothing in the stream.
func TestAppendFence(t *testing.T) {
	js := startState(t)
	ctx := context.Background()
	l := &changelog.Log{JS: js, MaxPiece: 100}
	first := bytes.Repeat([]byte("first record "), 20) // 260 bytes: 3 pieces
	seq, err := l.Append(ctx, 4, 0, first)
	if err != nil {
		t.Fatal(err)
	}
	if seq != 3 {
		t.Fatalf("the first record ends at %d, want 3 (3 pieces)", seq)
	}
	// Another writer, whose view of partition 4 is stale.
	if _, err := l.Append(ctx, 4, 0, []byte("another record")); !errors.Is(err, changelog.ErrFenced) {
		t.Fatalf("a write expecting an empty partition after a record: %v, want ErrFenced", err)
	}
	if _, err := l.Append(ctx, 4, 2, []byte("another record")); !errors.Is(err, changelog.ErrFenced) {
		t.Fatalf("a write expecting the middle of a record: %v, want ErrFenced", err)
	}
	// Another partition has its own position.
	if s, err := l.Append(ctx, 5, 0, []byte("five")); err != nil || s != 4 {
		t.Fatalf("partition 5: %d, %v; want 4", s, err)
	}
	next, err := l.Append(ctx, 4, seq, []byte("second record"))
	if err != nil || next != 5 {
		t.Fatalf("the next record of partition 4: %d, %v; want 5", next, err)
	}
	s, err := js.Stream(ctx, bus.StreamState)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 5 {
		t.Fatalf("the stream holds %d messages, want 5 (nothing of the fenced writes)", info.State.Msgs)
	}
	// Read back, the pieces make the record again.
	a := changelog.NewAssembler()
	var got []byte
	for seq := uint64(1); seq <= 3; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		rec, complete, err := a.Add(4, m.Header, m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if complete {
			got = rec
		}
	}
	if !bytes.Equal(got, first) {
		t.Fatalf("read back %q, want %q", got, first)
	}
}

// Records appended to CTX_STATE, cut into pieces, are followed back in
// order and rebuild a database, as a bulk load, identical to the one that
// committed them; UpTo stops each partition where it says.
func TestRebuildFromTheLog(t *testing.T) {
	js := startState(t)
	ctx := context.Background()
	live := openStore(t, "live.db")
	records := realRecords(t, live)
	l := &changelog.Log{JS: js, MaxPiece: 16 << 10}
	at := map[int]uint64{}
	pieces := 0
	for i, r := range records {
		data, err := changelog.Encode(r)
		if err != nil {
			t.Fatal(err)
		}
		seq, err := l.Append(ctx, r.Partition, at[r.Partition], data)
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		at[r.Partition] = seq
		pieces += (len(data) + l.MaxPiece - 1) / l.MaxPiece
	}
	if pieces == len(records) {
		t.Fatal("no record was cut into pieces")
	}
	rebuilt := openStore(t, "rebuilt.db", store.WithBulkLoad())
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	stats, err := changelog.Rebuild(rctx, js, rebuilt, changelog.RebuildOptions{BatchEntries: 50})
	if err != nil {
		t.Fatal(err)
	}
	entries := 0
	for _, r := range records {
		entries += len(r.Entries)
	}
	if stats.Records != len(records) || stats.Entries != entries || stats.Messages != uint64(pieces) {
		t.Fatalf("rebuilt %d records, %d entries from %d messages; want %d, %d, %d", stats.Records, stats.Entries,
			stats.Messages, len(records), entries, pieces)
	}
	identical(t, live, rebuilt)
	pos, cursor, err := rebuilt.LogPositions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if cursor != uint64(pieces) || len(pos) != len(at) {
		t.Fatalf("positions %v, cursor %d; want %v, %d", pos, cursor, at, pieces)
	}
	for p, seq := range at {
		if pos[p] != seq {
			t.Fatalf("positions %v, want %v", pos, at)
		}
	}

	// Up to partition 0's position after its first records only: the
	// other partitions are not named, so they are skipped.
	upTo := map[int]uint64{0: 0}
	var want []changelog.Record
	for i, r := range records {
		if r.Partition == 0 && i < len(records)/2 {
			want = append(want, r)
		}
	}
	seq, n := uint64(0), 0
	for _, r := range records {
		data, _ := changelog.Encode(r)
		seq += uint64((len(data) + l.MaxPiece - 1) / l.MaxPiece)
		if r.Partition == 0 {
			if n++; n == len(want) {
				upTo[0] = seq
				break
			}
		}
	}
	part := openStore(t, "part.db", store.WithBulkLoad())
	stats, err = changelog.Rebuild(rctx, js, part, changelog.RebuildOptions{UpTo: upTo})
	if err != nil {
		t.Fatal(err)
	}
	if stats.Records != len(want) {
		t.Fatalf("up to %v: %d records, want %d", upTo, stats.Records, len(want))
	}
	expect := openStore(t, "expect.db")
	replay(t, expect, want)
	identical(t, expect, part)
}

// A bulk load needs a new file, and ends on Close when nobody ended it:
// what it wrote is there when the file is opened again.
func TestBulkLoadNeedsANewFile(t *testing.T) {
	ctx := context.Background()
	live := openStore(t, "live.db")
	if _, err := store.Open(ctx, live.Path(), store.WithBulkLoad()); err == nil {
		t.Fatal("a bulk load opened an existing file")
	}
	records := realRecords(t, live)
	bulk := openStore(t, "bulk.db", store.WithBulkLoad())
	for _, r := range records {
		tx, err := bulk.Begin(ctx, []store.Group{{At: r.At, Entries: r.Entries, Published: true}})
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(nil, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := bulk.Close(); err != nil {
		t.Fatal(err)
	}
	if mode := journalMode(t, bulk.Path()); mode != "wal" {
		t.Fatalf("after Close the file's journal mode is %q, want wal", mode)
	}
	again, err := store.Open(ctx, bulk.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	identical(t, live, again)
}

// Append's doc says that the same write sent again after its ack was lost
// is recognised as the same (its Nats-Msg-Id) and answers the position it
// reached. nats-server (v2.15.2) checks Nats-Expected-Last-Subject-Sequence
// before the duplicate window, so the retry, which still expects the
// position before the write, is refused as fenced instead: the writer
// takes its own record for another's. This test states the documented
// behaviour; it is skipped while Append does not recognise its own write
// behind a fence refusal (for example by reading the subject's messages
// after the position it expected and comparing their ids).
func TestAppendRetryAfterLostAck(t *testing.T) {
	js := startState(t)
	ctx := context.Background()
	l := &changelog.Log{JS: js, MaxPiece: 100}
	data := bytes.Repeat([]byte("a record "), 30) // 3 pieces
	seq, err := l.Append(ctx, 1, 0, data)
	if err != nil {
		t.Fatal(err)
	}
	again, err := l.Append(ctx, 1, 0, data)
	if err != nil || again != seq {
		t.Fatalf("the same write again: %d, %v; want %d", again, err, seq)
	}
}

// A set of files is rebuilt all at once, each file from its partitions'
// subjects alone: each holds what a replay of its partitions' records
// holds, and a file that holds no partition ends empty.
func TestRebuildSetByPartition(t *testing.T) {
	js := startState(t)
	ctx := context.Background()
	live := openStore(t, "live.db")
	records := realRecords(t, live)
	l := &changelog.Log{JS: js, MaxPiece: 16 << 10}
	at := map[int]uint64{}
	entries := 0
	for i, r := range records {
		data, err := changelog.Encode(r)
		if err != nil {
			t.Fatal(err)
		}
		seq, err := l.Append(ctx, r.Partition, at[r.Partition], data)
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		at[r.Partition] = seq
		entries += len(r.Entries)
	}
	set, err := store.OpenSet(ctx, t.TempDir(), 3, store.WithBulkLoad())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { set.Close() })
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	stats, err := changelog.RebuildSet(rctx, js, set, changelog.RebuildOptions{BatchEntries: 50})
	if err != nil {
		t.Fatal(err)
	}
	if stats.Records != len(records) || stats.Entries != entries {
		t.Fatalf("rebuilt %d records, %d entries; want %d, %d", stats.Records, stats.Entries, len(records), entries)
	}
	for i := range set.Len() {
		var want []changelog.Record
		for _, r := range records {
			if set.FileOf(r.Partition) == i {
				want = append(want, r)
			}
		}
		expect := openStore(t, fmt.Sprintf("expect%d.db", i))
		replay(t, expect, want)
		identical(t, expect, set.File(i))
		pos, _, err := set.File(i).LogPositions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for p, seq := range at {
			if got, ok := pos[p]; ok != (set.FileOf(p) == i) || ok && got != seq {
				t.Fatalf("file %d: positions %v, want partition %d at %d only in file %d", i, pos, p, seq, set.FileOf(p))
			}
		}
	}
	if n, err := set.File(2).ConversationCount(ctx); err != nil || n != 0 {
		t.Fatalf("the file that holds no partition holds %d conversations, %v", n, err)
	}
}
