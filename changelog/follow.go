package changelog

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
)

// inactive is how long the server keeps a follower's ordered consumer
// after its last pull (a restarted follower leaves the old one behind).
const inactive = 5 * time.Second

// switchBack is how many messages in a row a live follower reading data
// (having started headers only) must find it holds already before it goes
// back to reading headers only.
const switchBack = 256

// liveMaxBytes bounds what a live follower reading data has asked for and
// not yet taken: room for a few messages of the largest size.
const liveMaxBytes = 4 * bus.MaxMsgSize

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
	stream, err := js.Stream(ctx, bus.StreamState)
	if err != nil {
		return fmt.Errorf("follow %s: %w", bus.StreamState, err)
	}
	f := follower{stream: stream, subjects: []string{bus.StateSubjects}, have: have, asm: NewAssembler(), out: out,
		pullData: []jetstream.PullMessagesOpt{jetstream.PullMaxMessages(1024)}}
	_, err = f.run(ctx, from, false)
	return err
}

// FollowLive is Follow for a running instance, which wrote many of the
// records itself, of the partitions it holds (their subjects; nil: every
// partition). With headersOnly it reads headers only while have says the
// instance holds every message (a single instance thus never reads its own
// records back, the bulk of what it would read); at the
// first message it lacks, it reads on from there with a consumer that
// delivers data, and goes back to headers only after switchBack messages
// in a row it holds. Without headersOnly every message comes with its
// data, which is what a partition restored from the log wants. The data
// always comes from the consumer that delivered the message: a get by
// sequence is answered by the stream leader, which may not have stored yet
// a message a replica (serving the consumer) delivered, and answers 404
// then.
//
// Its pulls are short and carry heartbeats: when the node serving the
// ordered consumer dies, the library notices in two missed heartbeats and
// makes a new one, where with the defaults (30 s pulls) a follower would
// stall that long after a node loss, and every owner wait on it.
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
	short := []jetstream.PullMessagesOpt{jetstream.PullExpiry(3 * time.Second), jetstream.PullHeartbeat(time.Second)}
	f := follower{stream: stream, subjects: subjects, watched: watched, have: have, asm: NewAssembler(), out: out,
		switches:    headersOnly,
		pullHeaders: append([]jetstream.PullMessagesOpt{jetstream.PullMaxMessages(4096)}, short...),
		pullData:    append([]jetstream.PullMessagesOpt{jetstream.PullMaxBytes(liveMaxBytes)}, short...)}
	for {
		if from, err = f.run(ctx, from, headersOnly); err != nil {
			return err
		}
		headersOnly = !headersOnly
	}
}

// follower is what one Follow or FollowLive shares between its runs.
type follower struct {
	stream jetstream.Stream
	// subjects filter the consumer; watched are the subjects the watchdog
	// asks about (nil: the stream's last message is the follower's).
	subjects, watched []string
	have              func(p int, seq uint64) bool
	asm               *Assembler
	out               chan<- Item
	switches          bool // between headers only and data; false: data only
	// pullData and pullHeaders are the pull options of a run with data and
	// of one with headers only.
	pullData, pullHeaders []jetstream.PullMessagesOpt
}

// run reads CTX_STATE from sequence from with one ordered consumer,
// headers only or with data, until that way of reading stops paying: it
// returns the sequence to read on from with the other. Headers only, that
// is the first message have says the instance lacks (not sent: it is read
// again with its data); with data, the message after switchBack in a row
// the instance holds, when the follower switches. A run that does not
// switch ends only with an error.
func (f *follower) run(ctx context.Context, from uint64, headersOnly bool) (uint64, error) {
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: f.subjects, HeadersOnly: headersOnly, InactiveThreshold: inactive}
	if from > 1 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from
	}
	cons, err := f.stream.OrderedConsumer(ctx, cfg)
	if err != nil {
		return 0, fmt.Errorf("follow %s: %w", bus.StreamState, err)
	}
	pull := f.pullData
	if headersOnly {
		pull = f.pullHeaders
	}
	it, err := cons.Messages(pull...)
	if err != nil {
		return 0, fmt.Errorf("follow %s: %w", bus.StreamState, err)
	}
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	w := &watch{after: stallAfter, last: from - min(from, 1), subjects: f.watched}
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go w.run(wctx, f.stream, it.Stop)
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
		case f.have != nil && f.have(p, item.Seq):
			item.Partition = p
			f.asm.Drop(p)
			held++
		case headersOnly:
			return item.Seq, nil
		default:
			item.Partition = p
			f.asm.fill(&item, p, msg.Headers(), msg.Data())
			held = 0
		}
		select {
		case f.out <- item:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		if f.switches && !headersOnly && held >= switchBack {
			return item.Seq + 1, nil
		}
	}
}
