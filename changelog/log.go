package changelog

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
)

// A record larger than what one message may carry is cut into pieces, each
// a message on the partition's subject: pieces 1..n-1 carry PieceHeader
// with their number, the last carries PiecesHeader with n. A writer that
// dies between pieces leaves an incomplete run, which readers drop when the
// next record starts.
const (
	PieceHeader  = "Ctx-Piece"
	PiecesHeader = "Ctx-Pieces"
)

// ErrFenced means the partition's subject has moved past the sequence the
// writer expected: another instance (or this one, earlier) appended first.
// The writer's view of the partition is stale; it must catch up and retry.
var ErrFenced = errors.New("changelog: the partition moved on (another writer appended first)")

// ErrLost means the partition's subject holds less than the writer has
// applied already: records are gone from CTX_STATE (purged, or the stream
// was recreated). No writer can append after them; an operator must
// restore the stream (operations.md 4.2).
var ErrLost = errors.New("changelog: records this store applied are gone from CTX_STATE (purged or recreated?)")

// Log appends to CTX_STATE.
type Log struct {
	JS jetstream.JetStream
	// MaxPiece bounds one message's data (default: the connection's max
	// payload less room for headers).
	MaxPiece int
	// PublishTimeout bounds each message's publish (default 5 s). The
	// writer holds its SQLite transaction open while it appends: a publish
	// lost with a NATS node must fail the append soon, not hold every
	// partition's commits until a long deadline (seen: 30 s).
	PublishTimeout time.Duration
}

// Append publishes data, an encoded record of partition p, as the next
// message(s) of p's subject, on condition that the subject's last sequence
// is after (0: p has no message yet). It returns the sequence of the last
// message written. Each message's Nats-Msg-Id is its content's hash with
// the position it claims: a retry after a lost ack finds its own message
// after the fence and goes on from there, while a different write at the
// same position is refused (ErrFenced).
func (l *Log) Append(ctx context.Context, p int, after uint64, data []byte) (uint64, error) {
	maxPiece := l.MaxPiece
	if maxPiece <= 0 {
		maxPiece = int(l.JS.Conn().MaxPayload()) - 1024
	}
	n := (len(data) + maxPiece - 1) / maxPiece
	n = max(n, 1)
	subject := bus.StateSubject(p)
	for k := 1; k <= n; k++ {
		piece := data[(k-1)*maxPiece : min(k*maxPiece, len(data))]
		msg := nats.NewMsg(subject)
		msg.Data = piece
		if k < n {
			msg.Header.Set(PieceHeader, strconv.Itoa(k))
		} else {
			msg.Header.Set(PiecesHeader, strconv.Itoa(n))
		}
		sum := sha256.Sum256(piece)
		id := hex.EncodeToString(sum[:16]) + "@" + strconv.FormatUint(after, 10)
		ack, err := l.publish(ctx, msg, id, after)
		if err != nil {
			var apiErr *jetstream.APIError
			if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
				return 0, fmt.Errorf("append to %s: %w", subject, err)
			}
			// The server checks the fence before the duplicate window: a
			// retry of a write whose ack was lost is refused too. The
			// message right after the fence tells which it is.
			lctx, cancel := context.WithTimeout(ctx, cmp.Or(l.PublishTimeout, 5*time.Second))
			seq, mine := l.landed(lctx, subject, after, id)
			cancel()
			if !mine {
				if l.lost(ctx, subject, after) {
					return 0, fmt.Errorf("append to %s after %d: %w", subject, after, ErrLost)
				}
				return 0, fmt.Errorf("append to %s after %d: %w", subject, after, ErrFenced)
			}
			after = seq
			continue
		}
		after = ack.Sequence
	}
	return after, nil
}

// publish sends msg with Nats-Msg-Id id on condition that its subject's
// last sequence is after, within PublishTimeout. A replicated stream does
// not decide the condition (error 10164, where a decided one is 10071)
// while another message of the subject is being stored: one of another
// writer, or this writer's previous one, acknowledged already but not yet
// done with on the leader (back-to-back appends of a partition met that,
// one in a few thousand). The publish is sent again after a pause, until
// the condition is decided.
func (l *Log) publish(ctx context.Context, msg *nats.Msg, id string, after uint64) (*jetstream.PubAck, error) {
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(l.PublishTimeout, 5*time.Second))
	defer cancel()
	pause := time.Millisecond
	for {
		ack, err := l.JS.PublishMsg(ctx, msg, jetstream.WithMsgID(id), jetstream.WithExpectStream(bus.StreamState),
			jetstream.WithExpectLastSequencePerSubject(after))
		var apiErr *jetstream.APIError
		if err == nil || !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequenceConstant {
			return ack, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(pause):
		}
		pause = min(2*pause, 50*time.Millisecond)
	}
}

// lost tells whether subject's last message is older than sequence after,
// which the writer expected to find: the records up to it are gone.
func (l *Log) lost(ctx context.Context, subject string, after uint64) bool {
	if after == 0 {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(l.PublishTimeout, 5*time.Second))
	defer cancel()
	s, err := l.JS.Stream(ctx, bus.StreamState)
	if err != nil {
		return false
	}
	m, err := s.GetLastMsgForSubject(ctx, subject)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return true
	case err != nil:
		return false
	}
	return m.Sequence < after
}

// landed tells whether the message of subject right after sequence after
// is this writer's piece with Nats-Msg-Id id, and its sequence.
func (l *Log) landed(ctx context.Context, subject string, after uint64, id string) (uint64, bool) {
	s, err := l.JS.Stream(ctx, bus.StreamState)
	if err != nil {
		return 0, false
	}
	m, err := s.GetMsg(ctx, after+1, jetstream.WithGetMsgSubject(subject))
	if err != nil || m.Header.Get(jetstream.MsgIDHeader) != id {
		return 0, false
	}
	return m.Sequence, true
}

// Assembler puts records back together from the messages of CTX_STATE, read
// in stream order. It keeps the pieces of each partition's record in
// progress.
type Assembler struct {
	pieces map[int][][]byte
}

// NewAssembler returns an empty Assembler.
func NewAssembler() *Assembler { return &Assembler{pieces: map[int][][]byte{}} }

// Add takes the next message of partition p. It returns the record's bytes
// when the message completes one (complete true), or nothing when it is a
// piece. Pieces of a run that never completed are dropped when the next run
// starts. A message with neither header, or with numbers out of order, is
// an error (the caller skips it).
func (a *Assembler) Add(p int, h nats.Header, data []byte) (record []byte, complete bool, err error) {
	if k := h.Get(PieceHeader); k != "" {
		i, err := strconv.Atoi(k)
		if err != nil || i < 1 {
			delete(a.pieces, p)
			return nil, false, fmt.Errorf("bad %s %q", PieceHeader, k)
		}
		if i == 1 {
			a.pieces[p] = nil
		}
		if len(a.pieces[p]) != i-1 {
			delete(a.pieces, p)
			return nil, false, fmt.Errorf("piece %d of partition %d out of order", i, p)
		}
		a.pieces[p] = append(a.pieces[p], data)
		return nil, false, nil
	}
	n, err := strconv.Atoi(h.Get(PiecesHeader))
	if err != nil || n < 1 {
		delete(a.pieces, p)
		return nil, false, fmt.Errorf("bad %s %q", PiecesHeader, h.Get(PiecesHeader))
	}
	prev := a.pieces[p]
	delete(a.pieces, p)
	if n == 1 {
		return data, true, nil
	}
	if len(prev) != n-1 {
		return nil, false, fmt.Errorf("record of partition %d has %d pieces of %d", p, len(prev)+1, n)
	}
	size := len(data)
	for _, b := range prev {
		size += len(b)
	}
	out := make([]byte, 0, size)
	for _, b := range prev {
		out = append(out, b...)
	}
	return append(out, data...), true, nil
}

// fill takes partition p's next message into item: a piece, the record it
// completes (decoded, and checked to be p's), or why it cannot be read.
func (a *Assembler) fill(item *Item, p int, h nats.Header, data []byte) {
	data, complete, err := a.Add(p, h, data)
	switch {
	case err != nil:
		item.Err = err
	case !complete:
		item.Piece = true
	default:
		rec, err := Decode(data)
		if err == nil && rec.Partition != p {
			err = fmt.Errorf("record of partition %d on the subject of %d", rec.Partition, p)
		}
		if err != nil {
			item.Err = err
		} else {
			item.Record = &rec
		}
	}
}

// Drop forgets partition p's pieces (the reader skipped their record).
func (a *Assembler) Drop(p int) { delete(a.pieces, p) }

// Pending tells whether partition p has pieces of an unfinished record.
func (a *Assembler) Pending(p int) bool { return len(a.pieces[p]) > 0 }

// inactive is how long the server keeps a follower's ordered consumer
// after its last pull (a restarted follower leaves the old one behind).
const inactive = 5 * time.Second

// stallAfter is how long a follower may wait for its next message while
// the stream holds messages past the last one it got, before it gives up on
// its ordered consumer. After a node loss, the library re-creates an
// ordered consumer by itself, quietly and without bound (10 s a try, with
// backoff): a follower sat a minute behind the stream, and every owner
// waited on it.
const stallAfter = 4 * time.Second

// watch is the follower's watchdog: it stops the iterator (through stop)
// when the follower, waiting, has gone stallAfter without the message the
// stream holds past the last it got (counted from when the watchdog first
// saw the stream ahead, not from the start of the wait), and Err then says
// so.
type watch struct {
	after time.Duration // stallAfter but in tests
	// subjects are the follower's, when it follows some partitions only:
	// the stream's last message may then be none of theirs.
	subjects []string
	mu       sync.Mutex
	last     uint64    // the last sequence delivered
	waiting  time.Time // since when Next waits; zero when not waiting
	err      error
}

// behind is what the watchdog saw last: since when the stream has held a
// message past last while the follower waited. A wait that began in an
// idle spell says nothing about how long a new message has been waiting
// for delivery: only this does.
type behind struct {
	since time.Time
	last  uint64
}

func (w *watch) wait() {
	w.mu.Lock()
	w.waiting = time.Now()
	w.mu.Unlock()
}

func (w *watch) got(seq uint64) {
	w.mu.Lock()
	w.last, w.waiting = seq, time.Time{}
	w.mu.Unlock()
}

// Err is set once the watchdog stopped the iterator.
func (w *watch) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

func (w *watch) run(ctx context.Context, stream jetstream.Stream, stop func()) {
	t := time.NewTicker(w.after / 4)
	defer t.Stop()
	var b behind
	// quiet is the stream's end at which lastOf last found nothing of the
	// watched subjects past quietLast: while the stream stays there, a
	// request per subject a tick (an idle instance holding 32 partitions
	// made 33 requests a second) would only say so again.
	var quiet, quietLast uint64
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.mu.Lock()
		since, last := w.waiting, w.last
		w.mu.Unlock()
		if since.IsZero() || time.Since(since) < w.after {
			b = behind{}
			continue
		}
		ictx, cancel := context.WithTimeout(ctx, max(w.after/2, time.Second))
		info, err := stream.Info(ictx)
		cancel()
		if err != nil {
			continue // the server cannot tell: the next tick asks again
		}
		end := info.State.LastSeq
		if end > last && len(w.subjects) > 0 {
			if end == quiet && last == quietLast {
				end = last
			} else if sub, ok := w.lastOf(ctx, stream); ok {
				end = sub
				if end <= last {
					quiet, quietLast = info.State.LastSeq, last
				}
			}
			// When the server cannot tell the subjects' last message, the
			// stream's end stands for it: a follower that is only idle is
			// then started again (one new ordered consumer), while taking
			// "cannot tell" for "idle" would leave a stalled one stalled
			// for as long as the requests fail, which is when a node is
			// lost.
		}
		if end <= last {
			b = behind{} // idle
			continue
		}
		if b.since.IsZero() || b.last != last {
			// First seen behind: the message may have just been appended
			// after a long idle wait, and be on its way.
			b = behind{since: time.Now(), last: last}
			continue
		}
		if time.Since(b.since) < w.after {
			continue
		}
		w.mu.Lock()
		stalled := !w.waiting.IsZero() && w.last == last
		if stalled {
			w.err = fmt.Errorf("follow %s: no message for %v after %d while the stream holds up to %d",
				bus.StreamState, time.Since(b.since).Round(time.Second), last, end)
		}
		w.mu.Unlock()
		if stalled {
			stop()
			return
		}
	}
}

// lastOf is the last sequence of the watched subjects (0: none holds a
// message); ok is false when the server cannot tell.
func (w *watch) lastOf(ctx context.Context, stream jetstream.Stream) (end uint64, ok bool) {
	for _, subj := range w.subjects {
		ictx, cancel := context.WithTimeout(ctx, max(w.after/2, time.Second))
		m, err := stream.GetLastMsgForSubject(ictx, subj)
		cancel()
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
		case err != nil:
			return 0, false
		default:
			end = max(end, m.Sequence)
		}
	}
	return end, true
}

// Item is one message of CTX_STATE as a follower sees it.
type Item struct {
	Seq       uint64 // stream sequence
	Partition int
	// Record is set when this message completes a record; Err when the
	// message or the record could not be read (the follower skips it).
	Record *Record
	Err    error
	// Piece is true for a piece of a record still incomplete.
	Piece bool
	// Pending is how many messages the stream holds after this one.
	Pending uint64
}

// Follow reads CTX_STATE from sequence from on (1: everything), in order,
// and sends every message to out until ctx ends or the consumer fails. It
// uses an ordered consumer: the server keeps no state for it, and the
// library recreates it after a gap. have tells which messages the reader
// holds already (its own appends): those are passed on without being
// decoded, with neither Record nor Piece set.
func Follow(ctx context.Context, js jetstream.JetStream, from uint64, have func(p int, seq uint64) bool, out chan<- Item) error {
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{bus.StateSubjects}, InactiveThreshold: inactive}
	if from > 1 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from
	}
	stream, err := js.Stream(ctx, bus.StreamState)
	if err != nil {
		return fmt.Errorf("follow %s: %w", bus.StreamState, err)
	}
	cons, err := stream.OrderedConsumer(ctx, cfg)
	if err != nil {
		return fmt.Errorf("follow %s: %w", bus.StreamState, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(1024))
	if err != nil {
		return fmt.Errorf("follow %s: %w", bus.StreamState, err)
	}
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	w := &watch{after: stallAfter, last: from - min(from, 1)}
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go w.run(wctx, stream, it.Stop)
	asm := NewAssembler()
	for {
		w.wait()
		msg, err := it.Next()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if werr := w.Err(); werr != nil {
				return werr
			}
			return fmt.Errorf("follow %s: %w", bus.StreamState, err)
		}
		md, err := msg.Metadata()
		if err != nil {
			continue
		}
		w.got(md.Sequence.Stream)
		item := Item{Seq: md.Sequence.Stream, Pending: md.NumPending}
		p, ok := bus.PartitionOfState(msg.Subject())
		if !ok {
			item.Err = fmt.Errorf("subject %q names no partition", msg.Subject())
		} else if item.Partition = p; have != nil && have(p, item.Seq) {
			asm.Drop(p)
		} else {
			asm.fill(&item, p, msg.Headers(), msg.Data())
		}
		select {
		case out <- item:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// switchBack is how many messages in a row a live follower reading data
// (having started headers only) must find it holds already before it goes
// back to reading headers only.
const switchBack = 256

// liveMaxBytes bounds what a live follower reading data has asked for and
// not yet taken: room for a few messages of the largest size.
const liveMaxBytes = 4 * bus.MaxMsgSize

// FollowLive is Follow for a running instance, which wrote many of the
// records itself, of the partitions it holds (their subjects; nil: every
// partition). With headersOnly it reads headers only while have says the
// instance holds every message (a single instance thus never reads its own
// records back: on 4 MiB records that was a quarter of its CPU); at the
// first message it lacks, it reads on from there with a consumer that
// delivers data, and goes back to headers only after switchBack messages
// in a row it holds. Without headersOnly every message comes with its
// data, which is what a partition restored from the log wants. The data
// always comes from the consumer that delivered the message: a get by
// sequence is answered by the stream leader, which may not have stored yet
// a message a replica (serving the consumer) delivered, and answers 404
// then (seen while the leader was busy for milliseconds, a few hundred
// messages into a run).
func FollowLive(ctx context.Context, js jetstream.JetStream, subjects []string, from uint64, headersOnly bool, have func(p int, seq uint64) bool, out chan<- Item) error {
	var watched []string
	if len(subjects) == 0 {
		subjects = []string{bus.StateSubjects}
	} else {
		watched = subjects
	}
	stream, err := js.Stream(ctx, bus.StreamState)
	if err != nil {
		return fmt.Errorf("follow %s: %w", bus.StreamState, err)
	}
	l := liveFollower{stream: stream, subjects: subjects, watched: watched, have: have, asm: NewAssembler(), out: out,
		switches: headersOnly}
	for {
		if from, err = l.run(ctx, from, headersOnly); err != nil {
			return err
		}
		headersOnly = !headersOnly
	}
}

// liveFollower is what FollowLive's runs share.
type liveFollower struct {
	stream            jetstream.Stream
	subjects, watched []string
	have              func(p int, seq uint64) bool
	asm               *Assembler
	out               chan<- Item
	switches          bool // between headers only and data; false: data only
}

// run reads CTX_STATE from sequence from with one ordered consumer,
// headers only or with data, until that way of reading stops paying: it
// returns the sequence to read on from with the other. Headers only, that
// is the first message have says the instance lacks (not sent: it is read
// again with its data); with data, the message after switchBack in a row
// the instance holds.
func (l *liveFollower) run(ctx context.Context, from uint64, headersOnly bool) (uint64, error) {
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: l.subjects, HeadersOnly: headersOnly, InactiveThreshold: inactive}
	if from > 1 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from
	}
	cons, err := l.stream.OrderedConsumer(ctx, cfg)
	if err != nil {
		return 0, fmt.Errorf("follow %s: %w", bus.StreamState, err)
	}
	// Short pulls with heartbeats: when the node serving the ordered
	// consumer dies, the library notices in two missed heartbeats and makes
	// a new one (with the defaults, 30 s pulls, a follower stalled that long
	// after a node loss, and every owner waiting on it).
	var batch jetstream.PullMessagesOpt = jetstream.PullMaxMessages(4096)
	if !headersOnly {
		batch = jetstream.PullMaxBytes(liveMaxBytes)
	}
	it, err := cons.Messages(batch, jetstream.PullExpiry(3*time.Second), jetstream.PullHeartbeat(time.Second))
	if err != nil {
		return 0, fmt.Errorf("follow %s: %w", bus.StreamState, err)
	}
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	w := &watch{after: stallAfter, last: from - min(from, 1), subjects: l.watched}
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go w.run(wctx, l.stream, it.Stop)
	held := 0 // messages in a row the instance holds
	for {
		w.wait()
		msg, err := it.Next()
		if err != nil {
			if ctx.Err() != nil {
				return 0, ctx.Err()
			}
			if werr := w.Err(); werr != nil {
				return 0, werr
			}
			return 0, fmt.Errorf("follow %s: %w", bus.StreamState, err)
		}
		md, err := msg.Metadata()
		if err != nil {
			continue
		}
		w.got(md.Sequence.Stream)
		item := Item{Seq: md.Sequence.Stream, Pending: md.NumPending}
		p, ok := bus.PartitionOfState(msg.Subject())
		switch {
		case !ok:
			item.Err = fmt.Errorf("subject %q names no partition", msg.Subject())
		case l.have != nil && l.have(p, item.Seq):
			item.Partition = p
			l.asm.Drop(p)
			held++
		case headersOnly:
			return item.Seq, nil
		default:
			item.Partition = p
			l.asm.fill(&item, p, msg.Headers(), msg.Data())
			held = 0
		}
		select {
		case l.out <- item:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		if l.switches && !headersOnly && held >= switchBack {
			return item.Seq + 1, nil
		}
	}
}

// LastOf is the sequence of partition p's last message in CTX_STATE (s),
// 0 when it has none.
func LastOf(ctx context.Context, s jetstream.Stream, p int) (uint64, error) {
	m, err := s.GetLastMsgForSubject(ctx, bus.StateSubject(p))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("last of %s: %w", bus.StateSubject(p), err)
	}
	return m.Sequence, nil
}
