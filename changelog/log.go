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
	"github.com/ctxpipe/ctxpipe/internal/backoff"
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
	// partition's commits until a long deadline.
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

// undecidedRetry is the pause before publish sends again a message whose
// condition the stream left undecided: from 1 ms doubling to 50 ms.
var undecidedRetry = backoff.Policy{First: time.Millisecond, Max: 50 * time.Millisecond}

// publish sends msg with Nats-Msg-Id id on condition that its subject's
// last sequence is after, within PublishTimeout. A replicated stream does
// not decide the condition (error 10164, where a decided one is 10071)
// while another message of the subject is being stored: one of another
// writer, or this writer's previous one, acknowledged already but not yet
// done with on the leader (back-to-back appends of a partition meet that).
// The publish is sent again after a pause, until the condition is decided.
func (l *Log) publish(ctx context.Context, msg *nats.Msg, id string, after uint64) (*jetstream.PubAck, error) {
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(l.PublishTimeout, 5*time.Second))
	defer cancel()
	pauses := backoff.New(undecidedRetry)
	for {
		ack, err := l.JS.PublishMsg(ctx, msg, jetstream.WithMsgID(id), jetstream.WithExpectStream(bus.StreamState),
			jetstream.WithExpectLastSequencePerSubject(after))
		var apiErr *jetstream.APIError
		if err == nil || !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequenceConstant {
			return ack, err
		}
		if backoff.Sleep(ctx, pauses.Next()) != nil {
			return nil, err
		}
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

// LastOfEach is LastOf of each partition, asked all at once: one after the
// other, each would wait its own round trip to the stream's leader, which
// after a node loss can be slow.
func LastOfEach(ctx context.Context, s jetstream.Stream, partitions []int) ([]uint64, error) {
	lasts := make([]uint64, len(partitions))
	errs := make([]error, len(partitions))
	var wg sync.WaitGroup
	for i, p := range partitions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lasts[i], errs[i] = LastOf(ctx, s, p)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return lasts, nil
}
