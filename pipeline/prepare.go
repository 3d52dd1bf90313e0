package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/engine"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/store"
)

// preparer turns a conversation's batch of fetched inputs into the entries
// one commit stores: each input decoded and checked (its size, its
// deliveries, its id seen before), then applied by the engine on a view of
// the conversation that carries the batch's earlier inputs, or rejected
// with an input_rejected event. A failure that is not the input's (the
// store, the profiles bucket, the summarizer) comes back as an error: the
// worker retries the batch.
type preparer struct {
	stores   *store.Set
	profiles *Profiles
	engine   *engine.Engine
	// maxInputBytes and maxDeliver are Config's MaxInputBytes and
	// MaxDeliver.
	maxInputBytes, maxDeliver int
	logger                    *slog.Logger
	metrics                   *Metrics
}

// preEncodeMax is the largest input a worker encodes for the committer
// (prepare).
const preEncodeMax = 256 << 10

// prepare runs the engine over a conversation's batch. Each conversation's state and
// history are read from the store once and then carried forward in memory,
// so the inputs of one batch see each other's effects before they commit.
// Duplicates are found for the whole batch in one query.
func (pr *preparer) prepare(ctx context.Context, batch []*job) ([]store.Entry, error) {
	type item struct {
		in  schema.Input
		rej *store.Entry
	}
	items := make([]item, len(batch))
	// Input ids are unique per tenant. A batch is one conversation's, so
	// one tenant's; grouped anyway, so that no id is ever looked up in
	// another tenant's.
	ids := map[string][]string{}
	for i, j := range batch {
		in, rej := pr.decode(j)
		items[i] = item{in, rej}
		if rej == nil {
			tenant := j.tenant()
			ids[tenant] = append(ids[tenant], in.ID)
		}
	}
	// A batch is one conversation's, so one partition's: one file.
	st := pr.stores.ForPartition(batch[0].partition)
	stored := map[inputKey]store.SeenInput{}
	for tenant, group := range ids {
		seen, err := st.SeenInputs(ctx, tenant, group)
		if err != nil {
			return nil, err
		}
		for id, si := range seen {
			stored[inputKey{tenant, id}] = si
		}
	}
	views := map[string]*convView{}
	seen := map[inputKey]bool{}
	// taken holds this batch's applied inputs, as the store will hold them.
	taken := map[inputKey]store.SeenInput{}
	entries := make([]store.Entry, 0, len(batch))
	for i, j := range batch {
		var e *store.Entry
		it := items[i]
		if it.rej != nil {
			e = once(it.rej, seen)
			if e != nil {
				entries = append(entries, *e)
			}
			continue
		}
		key := inputKey{j.tenant(), it.in.ID}
		prev, dup := taken[key]
		if !dup {
			prev, dup = stored[key]
		}
		switch {
		case dup && sameInput(prev, it.in.ConversationID, j.payloadHash()):
			// A redelivery, or the client sent it again: already done.
			pr.metrics.Inc("ctxpipe_inputs_total", `outcome="duplicate"`)
			continue
		case dup:
			e = pr.reusedID(j, it.in, prev, seen)
		default:
			var err error
			if e, err = pr.apply(ctx, st, j, it.in, views, seen); err != nil {
				return nil, err
			}
			taken[key] = store.SeenInput{ConversationID: it.in.ConversationID, PayloadHash: j.payloadHash()}
		}
		if e != nil {
			entries = append(entries, *e)
		}
	}
	// Encode here, on the worker, what the committer would otherwise encode
	// on its one goroutine, twice (for SQLite and for the changelog record).
	// An entry that cannot be encoded is left unencoded: the commit refuses
	// its batch, commits the other requests alone, and the worker's
	// retries end in a poison rejection.
	for i := range entries {
		// Not a huge turn: its encoding would be held, beside its payload
		// and its decoded content, for as long as the batch waits for the
		// committer (4 MiB turns raised the service's peak RSS by a
		// third); the committer encodes it when it gets there.
		if e := &entries[i]; e.Changes != nil && e.Encoded == nil && len(e.Input.Payload) <= preEncodeMax {
			if enc, err := store.EncodeChanges(*e); err == nil {
				e.Encoded = enc
			}
		}
	}
	return entries, nil
}

// sameInput tells whether a stored input is this very input again: the same
// conversation and the same bytes.
func sameInput(prev store.SeenInput, conv string, hash [32]byte) bool {
	return prev.ConversationID == conv && prev.PayloadHash == hash
}

// reusedID rejects an input whose id was used before with other content or
// in another conversation (duplicate_id). The rejection is recorded under an
// id derived from the input id, the conversation and the content, so it is
// idempotent itself and never collides with the input that owns the id.
func (pr *preparer) reusedID(j *job, in schema.Input, prev store.SeenInput, seen map[inputKey]bool) *store.Entry {
	h := j.payloadHash()
	where := "with other content"
	if prev.ConversationID != in.ConversationID {
		where = "in another conversation"
	}
	e := pr.rejection(j, in.ID, schema.Errorf(schema.ReasonDuplicateID, "input id %s was used before %s", in.ID, where))
	e.Input.ID = engine.DeriveID(fmt.Sprintf("%s/%s/%x", in.ID, in.ConversationID, h[:8]), "input/duplicate_id")
	e.Input.ConversationID, e.Input.TS = in.ConversationID, in.TS
	ev := e.Changes.Events[0].(*schema.InputRejected)
	ev.ID = engine.DeriveID(e.Input.ID, "event/input_rejected")
	return once(&e, seen)
}

// decode checks an input's size and delivery count and decodes it; a bad
// input comes back as its rejection entry.
func (pr *preparer) decode(j *job) (schema.Input, *store.Entry) {
	data, subject := j.msg.Data(), j.subject
	var cause error
	switch {
	case len(data) > pr.maxInputBytes:
		cause = schema.Errorf(schema.ReasonTooLarge, "%d bytes is over the %d-byte limit", len(data), pr.maxInputBytes)
	case j.deliver >= uint64(pr.maxDeliver):
		cause = schema.Errorf(schema.ReasonPoison, "delivered %d times without being applied", j.deliver)
	default:
		in, err := schema.DecodeInput(subject, data)
		if err == nil {
			return in, nil
		}
		cause = err
	}
	e := pr.rejection(j, schema.PeekID(data), cause)
	return schema.Input{}, &e
}

// apply runs the engine for one decoded input.
func (pr *preparer) apply(ctx context.Context, s *store.Store, j *job, in schema.Input, views map[string]*convView, seen map[inputKey]bool) (*store.Entry, error) {
	v := views[in.ConversationID]
	if v == nil {
		st, _, err := s.State(ctx, in.ConversationID)
		if err != nil {
			return nil, fmt.Errorf("load state of %s: %w", in.ConversationID, err)
		}
		v = &convView{s: s, conv: in.ConversationID, state: st}
		views[in.ConversationID] = v
	}
	pid := v.state.ProfileID
	if in.Turn != nil && in.Turn.ProfileID != "" {
		pid = in.Turn.ProfileID
	}
	if pid == "" {
		pid = schema.DefaultProfileID
	}
	reject := func(err error) (*store.Entry, error) {
		e := pr.rejection(j, in.ID, err)
		e.Input.ConversationID, e.Input.TS = in.ConversationID, in.TS
		return once(&e, seen), nil
	}
	p, ok, err := pr.profiles.Lookup(ctx, pid)
	if err != nil {
		// The bucket cannot be read now: retried, then poison past the
		// retry budget; never rejected for a profile the watch missed.
		return nil, err
	}
	if !ok {
		return reject(schema.Errorf(schema.ReasonUnknownProfile, "no profile %q", pid))
	}
	t0 := time.Now()
	ch, err := pr.engine.Apply(ctx, v.state, v, &p, in)
	pr.metrics.Observe("ctxpipe_apply_seconds", fmt.Sprintf(`kind=%q`, in.Kind), time.Since(t0))
	if err != nil {
		if !rejects(err) {
			return nil, err
		}
		return reject(err)
	}
	v.state = ch.State
	v.pending = append(v.pending, ch)
	seen[inputKey{j.tenant(), in.ID}] = true
	payload, stored := j.storedPayload(store.StatusApplied)
	return &store.Entry{
		Input: store.InputRecord{
			ID: in.ID, ConversationID: in.ConversationID, Kind: string(in.Kind), Subject: j.subject,
			TS: in.TS, Payload: payload, Stored: stored, Status: store.StatusApplied,
		},
		Changes: ch,
	}, nil
}

// once drops a second copy of the same rejected input in one batch.
func once(e *store.Entry, seen map[inputKey]bool) *store.Entry {
	key := inputKey{e.Input.Tenant(), e.Input.ID}
	if seen[key] {
		return nil
	}
	seen[key] = true
	return e
}

// rejection records an input that will not be applied, with its payload and
// an input_rejected event. id is the input's own id when readable; otherwise
// one is derived from the stream sequence, which a redelivery keeps, so the
// rejection is idempotent too.
func (pr *preparer) rejection(j *job, id string, cause error) store.Entry {
	if !validUUID(id) {
		id = engine.DeriveID(fmt.Sprintf("%s/seq/%d", bus.StreamIn, j.seq), "input")
	}
	id = schema.CanonicalID(id)
	reason := schema.ReasonOf(cause)
	msg := cause.Error()
	var se *schema.Error
	if errors.As(cause, &se) {
		msg = se.Message
	}
	// Messages quote what the input held: a 2 MB field would make an event
	// too large to publish (and log).
	msg = schema.Clip(msg, schema.MaxMessageBytes)
	conv := j.conv
	if !schema.ValidConversationKey(conv) {
		conv = schema.ConversationKey(schema.SubjectTenant(j.subject), schema.InvalidConversationID)
	}
	subject := j.subject
	kind := subject[strings.LastIndexByte(subject, '.')+1:]
	ts := time.Now().UnixMilli()
	pr.logger.Info("input rejected", "conv", conv, "input_id", id, "reason", reason, "detail", msg)
	payload, stored := j.storedPayload(store.StatusRejected)
	return store.Entry{
		Input: store.InputRecord{
			ID: id, ConversationID: j.conv, Kind: kind, Subject: subject, TS: ts,
			Payload: payload, Stored: stored, Status: store.StatusRejected, Reason: string(reason),
		},
		Changes: &schema.Changes{Events: []schema.Event{&schema.InputRejected{
			EventHeader: schema.EventHeader{
				ID: engine.DeriveID(engine.Scope(j.tenant(), id), "event/input_rejected"), Type: schema.EventInputRejected,
				ConversationID: conv, TS: ts, InputID: id,
			},
			Reason: reason, Message: msg, Subject: subject,
		}}},
	}
}

func validUUID(s string) bool {
	_, err := uuid.Parse(s)
	return err == nil && len(s) == 36
}

// convView is a conversation as the store has it plus this batch's
// uncommitted changes; it serves the engine as its History.
type convView struct {
	s       *store.Store
	conv    string
	state   schema.ConversationState
	pending []*schema.Changes
}

func (v *convView) Messages(ctx context.Context) ([]schema.Message, error) {
	msgs, err := v.s.Messages(ctx, v.conv)
	if err != nil {
		return nil, err
	}
	// One copy of the history for all the batch's changes so far, not one
	// per change.
	return engine.Apply(msgs, v.pending...), nil
}

func (v *convView) ContextEvents(ctx context.Context) ([]schema.ContextEventRef, error) {
	refs, err := v.s.ContextEvents(ctx, v.conv)
	if err != nil {
		return nil, err
	}
	for _, ch := range v.pending {
		refs = append(refs, engine.ContextEventRefs(ch.Events)...)
	}
	return refs, nil
}
