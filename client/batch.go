package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/schema"
)

// JetStream's atomic batch publish: every message of a batch carries the
// batch's id and its place in it, and the last one says commit. The
// stream stores the messages only when the commit arrives and every one
// before it did, all at once; otherwise none of them.
const (
	hdrBatchID     = "Nats-Batch-Id"
	hdrBatchSeq    = "Nats-Batch-Sequence"
	hdrBatchCommit = "Nats-Batch-Commit"
)

// JetStream's error codes for a batch (err_code of the PubAck's error).
const (
	errCodeAtomicDisabled  = 10174
	errCodeBatchDuplicate  = 10201
	errCodeTooManyInflight = 10210
)

// Errors of AppendAll.
var (
	// ErrNoAtomicBatch: the stream (or the server) does not take atomic
	// batches; nothing of the batch was stored. Publish the turns one by
	// one instead (Append).
	ErrNoAtomicBatch = errors.New("ctxpipe: the stream does not take atomic batches")
	// ErrBatchDuplicate: a turn of the batch is in the stream already (an
	// earlier batch or Append with its id from this connection, inside the
	// stream's duplicate window); nothing of this batch was stored. Wait for that turn, read
	// what the conversation holds, and send the rest.
	ErrBatchDuplicate = errors.New("ctxpipe: a turn of the batch is in the stream already")
)

// batchAck is the stream's answer to a message of a batch: empty for one
// stored to wait for the commit, a PubAck naming the batch for the commit.
type batchAck struct {
	Stream string `json:"stream"`
	Seq    uint64 `json:"seq"`
	Batch  string `json:"batch"`
	Count  int    `json:"count"`
	Error  *struct {
		Code        int    `json:"code"`
		ErrCode     int    `json:"err_code"`
		Description string `json:"description"`
	} `json:"error"`
}

// AppendAll publishes turns, all of one conversation, in order, as one
// atomic batch, and returns their ids once the stream stored them all.
// When it fails, the stream stored none of them; the one exception is a
// commit whose answer was lost (a timeout, the connection dropping), after
// which the batch may or may not be in the stream: sending it again then
// fails with ErrBatchDuplicate if it is. Ids and timestamps are filled as
// Append fills them, and each message's Nats-Msg-Id is made of its turn's
// id as Append makes it (bus.MsgID).
//
// The stream must allow atomic publish (bus.InStreamConfig does); where it
// does not, AppendAll fails with ErrNoAtomicBatch having stored nothing. A
// single turn is published as Append publishes it.
func (c *Client) AppendAll(ctx context.Context, turns []schema.Turn) ([]string, error) {
	if len(turns) == 0 {
		return nil, nil
	}
	ids := make([]string, len(turns))
	data := make([][]byte, len(turns))
	conv := turns[0].ConversationID
	for i := range turns {
		t := turns[i]
		if t.ConversationID != conv {
			return nil, fmt.Errorf("ctxpipe append: a batch holds turns of %s and %s: one conversation only", conv, t.ConversationID)
		}
		if t.ID == "" {
			t.ID = uuid.NewString()
		}
		if _, err := uuid.Parse(t.ID); err != nil || len(t.ID) != 36 {
			return nil, &RejectedError{InputID: t.ID, ConversationID: conv, Reason: schema.ReasonBadID,
				Message: fmt.Sprintf("id %q is not a UUID in its 36-character form", t.ID)}
		}
		if t.TS == 0 {
			t.TS = time.Now().UnixMilli()
		}
		b, err := schema.Marshal(t)
		if err != nil {
			return nil, fmt.Errorf("ctxpipe append to %s: %w", conv, err)
		}
		ids[i], data[i] = t.ID, b
	}
	if len(turns) == 1 {
		if _, err := c.Append(ctx, turns[0]); err != nil {
			return nil, err
		}
		return ids, nil
	}
	if !schema.ValidConversationID(conv) {
		return nil, &RejectedError{InputID: ids[0], ConversationID: conv, Reason: schema.ReasonBadConversationID,
			Message: fmt.Sprintf("conversation id %q must be 1-128 characters of [A-Za-z0-9_-], not starting with _", conv)}
	}
	ctx, cancel := c.bound(ctx, 0)
	defer cancel()
	subject := schema.InputSubject(c.scoped(conv), schema.KindTurn)
	batch := uuid.NewString()
	for i := range data {
		m := nats.NewMsg(subject)
		m.Data = data[i]
		m.Header.Set(jetstream.MsgIDHeader, bus.MsgID(c.nc, subject, ids[i]))
		m.Header.Set(jetstream.ExpectedStreamHeader, bus.StreamIn)
		m.Header.Set(hdrBatchID, batch)
		m.Header.Set(hdrBatchSeq, strconv.Itoa(i+1))
		last := i == len(data)-1
		if last {
			m.Header.Set(hdrBatchCommit, "1")
		}
		// Each message is a request: the stream answers once it holds it,
		// so that an error (no atomic publish, a full server) stops the
		// batch at once and the commit never races ahead of the rest.
		resp, err := c.nc.RequestMsgWithContext(ctx, m)
		if err != nil {
			if errors.Is(err, nats.ErrNoResponders) {
				err = jetstream.ErrNoStreamResponse
			}
			return nil, fmt.Errorf("ctxpipe append batch to %s (turn %d of %d): %w", conv, i+1, len(data), err)
		}
		if err := batchReply(resp.Data, batch, len(data), last); err != nil {
			return nil, fmt.Errorf("ctxpipe append batch to %s (turn %d of %d): %w", conv, i+1, len(data), err)
		}
	}
	return ids, nil
}

// batchReply reads the stream's answer to one message of a batch of n.
func batchReply(data []byte, batch string, n int, commit bool) error {
	if len(data) == 0 {
		if commit {
			return errors.New("the commit got an empty answer")
		}
		return nil
	}
	var a batchAck
	if err := json.Unmarshal(data, &a); err != nil {
		return fmt.Errorf("the stream's answer %q: %w", data, err)
	}
	if a.Error != nil {
		switch a.Error.ErrCode {
		case errCodeAtomicDisabled:
			return ErrNoAtomicBatch
		case errCodeBatchDuplicate:
			return ErrBatchDuplicate
		case errCodeTooManyInflight:
			return fmt.Errorf("%w: too many batches in flight on the stream", ErrNoAtomicBatch)
		}
		return fmt.Errorf("the stream refused the batch: %s (%d)", a.Error.Description, a.Error.ErrCode)
	}
	if !commit || a.Batch != batch || a.Count != n {
		// A server that does not know batches stored the message alone,
		// as a plain publish: the rest must not follow it as a batch.
		return fmt.Errorf("%w: the stream stored a message of the batch alone (%s seq %d)", ErrNoAtomicBatch, a.Stream, a.Seq)
	}
	return nil
}
