package store

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"sync/atomic"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/schema"
)

// A Set is an instance's state split over a fixed number of SQLite files,
// each with its own single writer, so that commits of different files run
// in parallel and their fsyncs overlap. Partition p's conversations live in
// file p mod F (F the number of files): every conversation of a partition,
// every input of it and its changelog position are in one file, so a commit
// of a partition's inputs is one transaction of one file.
//
// File 0 is ctxpipe.db, the name a single-file instance used: an existing
// one keeps serving the partitions it maps to now, and its positions of the
// partitions now mapped elsewhere are simply not read (their file, new,
// holds no position of them, and the instance restores them from the
// changelog as it restores any partition it gains). A file's positions say
// exactly which records of each partition it reflects, so the same holds
// when F changes: each file is a copy of its partitions up to its
// positions, and the follower takes each partition on from there.
type Set struct {
	files []*Store
	// n is the partition count N (0 until known): a conversation key's file
	// follows from its partition (bus.PartitionOf).
	n atomic.Int64
}

// SetFileName is the name of file i of a set.
func SetFileName(i int) string {
	if i == 0 {
		return "ctxpipe.db"
	}
	return "ctxpipe-" + strconv.Itoa(i) + ".db"
}

// DefaultSetFiles is how many files an instance keeps its state in by
// default. More let more commits run at once where cores are free, but
// each file commits only its partitions' share of a round, so they make
// more, smaller transactions (an fsync and a changelog round trip each):
// on a 2-core machine one or two files were fastest (operations.md 4.7).
const DefaultSetFiles = 1

// OpenSet opens (creating as needed) files SQLite files in dir. The message
// cache (WithMessageCache) is shared out: each file gets its share of it.
func OpenSet(ctx context.Context, dir string, files int, opts ...Option) (*Set, error) {
	if files < 1 {
		return nil, fmt.Errorf("open store set: %d files (at least 1)", files)
	}
	cfg := config{cacheBytes: DefaultMessageCacheBytes}
	for _, o := range opts {
		o(&cfg)
	}
	share := append(slices.Clone(opts), WithMessageCache(cfg.cacheBytes/files))
	s := &Set{}
	for i := range files {
		st, err := Open(ctx, filepath.Join(dir, SetFileName(i)), share...)
		if err != nil {
			s.Close()
			return nil, err
		}
		s.files = append(s.files, st)
	}
	return s, nil
}

// NewSet makes a set of stores already open, file i being files[i].
func NewSet(files ...*Store) *Set {
	return &Set{files: files}
}

// Len is the number of files.
func (s *Set) Len() int { return len(s.files) }

// File is file i.
func (s *Set) File(i int) *Store { return s.files[i] }

// Files are the files, in order.
func (s *Set) Files() []*Store { return s.files }

// FileOf is the index of partition p's file.
func (s *Set) FileOf(p int) int {
	if p < 0 {
		return 0
	}
	return p % len(s.files)
}

// ForPartition is partition p's file.
func (s *Set) ForPartition(p int) *Store { return s.files[s.FileOf(p)] }

// SetPartitions tells the set N, the partition count (CTX_IN's transform).
func (s *Set) SetPartitions(n int) { s.n.Store(int64(n)) }

// Partitions is N, 0 until SetPartitions.
func (s *Set) Partitions() int { return int(s.n.Load()) }

// FileOfKey is the index of the file of the conversation with key (as
// schema.ConversationKey makes it); 0 while N is not known.
func (s *Set) FileOfKey(key string) int {
	if len(s.files) == 1 {
		return 0
	}
	n := s.Partitions()
	if n == 0 {
		return 0
	}
	tenant, conv := schema.SplitKey(key)
	return s.FileOf(bus.PartitionOf(tenant, conv, n))
}

// ForKey is the file of the conversation with key.
func (s *Set) ForKey(key string) *Store { return s.files[s.FileOfKey(key)] }

// Close closes every file.
func (s *Set) Close() error {
	var errs []error
	for _, f := range s.files {
		errs = append(errs, f.Close())
	}
	return errors.Join(errs...)
}

// The reads below span all of the instance's conversations at once, across
// every file of the set.

// ConversationInfos lists the conversations of every file, each from the
// file of its partition (a file may keep stale copies of partitions mapped
// elsewhere since the number of files changed), in key order.
func (s *Set) ConversationInfos(ctx context.Context) ([]ConversationInfo, error) {
	var out []ConversationInfo
	for i, f := range s.files {
		infos, err := f.ConversationInfos(ctx)
		if err != nil {
			return nil, err
		}
		for _, ci := range infos {
			if s.FileOfKey(ci.Key) == i {
				out = append(out, ci)
			}
		}
	}
	slices.SortFunc(out, func(a, b ConversationInfo) int {
		switch {
		case a.Key < b.Key:
			return -1
		case a.Key > b.Key:
			return 1
		}
		return 0
	})
	return out, nil
}

// InputMark moves whenever an input is stored in any file: the sum of the
// files' marks, each of which only grows.
func (s *Set) InputMark(ctx context.Context) (int64, error) {
	return sumFiles(ctx, s, (*Store).InputMark)
}

// ConversationCount is the number of conversations the files hold
// together (a stale copy left in a file since the number of files changed
// counts too: the count is for a gauge, and reading every file's list for
// it would cost a scan per scrape).
func (s *Set) ConversationCount(ctx context.Context) (int, error) {
	return sumFiles(ctx, s, (*Store).ConversationCount)
}

// sumFiles adds up what read says of each file.
func sumFiles[N int | int64](ctx context.Context, s *Set, read func(*Store, context.Context) (N, error)) (N, error) {
	var sum N
	for _, f := range s.files {
		n, err := read(f, ctx)
		if err != nil {
			return 0, err
		}
		sum += n
	}
	return sum, nil
}

// Load reads a conversation from its file.
func (s *Set) Load(ctx context.Context, key string) (Snapshot, error) {
	return s.ForKey(key).Load(ctx, key)
}

// UpdatedAt reads when a conversation last changed, from its file.
func (s *Set) UpdatedAt(ctx context.Context, key string) (int64, bool, error) {
	return s.ForKey(key).UpdatedAt(ctx, key)
}

// Events reads a conversation's events from its file.
func (s *Set) Events(ctx context.Context, key string) ([]schema.Event, error) {
	return s.ForKey(key).Events(ctx, key)
}

// State reads a conversation's state from its file.
func (s *Set) State(ctx context.Context, key string) (schema.ConversationState, bool, error) {
	return s.ForKey(key).State(ctx, key)
}
