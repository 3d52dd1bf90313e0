package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ctxpipe/ctxpipe/client"
	"github.com/ctxpipe/ctxpipe/schema"
)

// maxConvs bounds the conversations whose state the proxy holds; past it
// the state of others is dropped (it is read again from ctxpipe).
const maxConvs = 10000

// maxForks bounds how many continuations of one conversation a request
// may walk through.
const maxForks = 64

// conv is the proxy's state of one conversation: readers of its full and
// effective views that ask only for what changed, the system prompt last
// published, and the last turn published, which a read waits for.
type conv struct {
	mu        sync.Mutex
	id        string
	full, eff *client.Tracker
	system    string
	sysKnown  bool
	lastTS    int64
	pending   string
}

// conv returns the state of conversation id, making it when needed.
func (p *Proxy) conv(id string) *conv {
	p.mu.Lock()
	defer p.mu.Unlock()
	if cv, ok := p.convs[id]; ok {
		return cv
	}
	if len(p.convs) >= maxConvs {
		for k := range p.convs {
			delete(p.convs, k)
			if len(p.convs) < maxConvs/2 {
				break
			}
		}
	}
	cv := &conv{id: id, full: p.c.Track(id, client.View(schema.ViewFull)), eff: p.c.Track(id)}
	p.convs[id] = cv
	return cv
}

// recorded is what a conversation holds of the agent's turns: their ids in
// order and their tokens (summaries, markers and stand-ins left out).
type recorded struct {
	ids    []string
	tokens int
}

// read returns the recorded turns of cv (none for a conversation that does
// not exist yet), once the last turn the proxy published is applied.
// cv.mu is held.
func (cv *conv) read(ctx context.Context) (recorded, error) {
	h, err := cv.full.Read(ctx, cv.pending)
	if errors.Is(err, client.ErrRejected) && cv.pending != "" {
		// The reply recorded last was refused: what matters is what the
		// conversation holds.
		cv.pending = ""
		h, err = cv.full.Read(ctx, "")
	}
	if errors.Is(err, client.ErrNotFound) {
		return recorded{}, nil
	}
	if err != nil {
		return recorded{}, err
	}
	cv.pending = ""
	var r recorded
	for i := range h.Messages {
		m := &h.Messages[i]
		if m.Synthetic() {
			continue
		}
		r.ids = append(r.ids, m.ID)
		r.tokens += m.Tokens
		if m.SystemPrompt != "" && !cv.sysKnown {
			cv.system = m.SystemPrompt
		}
	}
	cv.sysKnown = true
	return r, nil
}

// nextTS is a timestamp for the next turn of cv: now, but after the last.
func (cv *conv) nextTS() int64 {
	ts := time.Now().UnixMilli()
	if ts <= cv.lastTS {
		ts = cv.lastTS + 1
	}
	cv.lastTS = ts
	return ts
}

// located is the conversation a request continues and how.
type located struct {
	cv  *conv
	ids []string // the request's turn ids in cv
	rec recorded
	v   verdict
	at  int
	// forkedFrom is the conversation whose history the request stopped
	// extending ("" when none).
	forkedFrom string
	forkedAt   int
	// continuesFrom is the conversation that the new conversation cv
	// continues, recorded with its first turn (Turn.ContinuesFrom): the one
	// it forked from, or the one whose compaction it starts from.
	continuesFrom string
}

// ids are the turn ids the request's turns have in conversation conv.
func (p *Proxy) ids(conv string, req *request) []string {
	out := make([]string, len(req.turns))
	for i := range req.turns {
		out[i] = turnID(p.cfg.Secret, conv, i, req.turns[i].canon)
	}
	return out
}

// locate finds the conversation a request continues, and returns it
// locked. A request whose first turn is not the first turn recorded for
// its key is another thread of the session (a side request, or a history
// the client restarted) and has a conversation of its own, named after
// that turn. A request that stops extending its conversation's history
// later on continues in the next conversation of its line (conv-f1,
// conv-f2, ...): the first one it extends, or a new one.
func (p *Proxy) locate(ctx context.Context, key Key, req *request) (*located, error) {
	thread := key.Conversation()
	cv := p.conv(thread)
	cv.mu.Lock()
	rec, err := cv.read(ctx)
	if err != nil {
		cv.mu.Unlock()
		return nil, err
	}
	if len(rec.ids) > 0 && len(req.turns) > 0 && rec.ids[0] != turnID(p.cfg.Secret, thread, 0, req.turns[0].canon) {
		sum := sha256.Sum256(req.turns[0].canon)
		thread = fitID(thread + "__t" + hex.EncodeToString(sum[:8]))
		cv.mu.Unlock()
		cv = p.conv(thread)
		cv.mu.Lock()
		if rec, err = cv.read(ctx); err != nil {
			cv.mu.Unlock()
			return nil, err
		}
	}
	l := &located{}
	prev, prevAt := "", 0
	for n := 0; ; n++ {
		if n > 0 {
			cv = p.conv(forkID(thread, n))
			cv.mu.Lock()
			if rec, err = cv.read(ctx); err != nil {
				cv.mu.Unlock()
				return nil, err
			}
		}
		ids := p.ids(cv.id, req)
		v, at := matchTurns(rec.ids, ids)
		if v != diverged {
			l.cv, l.ids, l.rec, l.v, l.at = cv, ids, rec, v, at
			if n > 0 && len(rec.ids) == 0 {
				l.forkedFrom, l.forkedAt = prev, prevAt
				l.continuesFrom = prev
			}
			return l, nil
		}
		prev, prevAt = cv.id, at
		cv.mu.Unlock()
		if n+1 >= maxForks {
			return nil, fmt.Errorf("conversation %s has %d continuations already", thread, maxForks)
		}
	}
}

// publish records the request's turns from position l.at on, in order,
// as one atomic batch (client.AppendAll): they are all recorded, or none
// is. It returns the id of the last turn of the request ("" when it has
// none). cv.mu is held.
//
// When the stream holds some of the turns already (an earlier batch whose
// answer was lost), it waits until the first of them is applied, reads
// what the conversation holds, and sends the rest. Where the stream takes
// no atomic batches, the turns are published one by one (publishEach).
func (p *Proxy) publish(ctx context.Context, l *located, key Key, req *request) (string, error) {
	if len(req.turns) == 0 {
		return "", nil
	}
	last := l.ids[len(req.turns)-1]
	for try := 0; ; try++ {
		turns := p.turns(l, key, req)
		if len(turns) == 0 {
			return last, nil
		}
		_, err := p.c.AppendAll(ctx, turns)
		switch {
		case err == nil:
			p.published(l, turns)
			return last, nil
		case errors.Is(err, client.ErrNoAtomicBatch):
			return last, p.publishEach(ctx, l, turns)
		case errors.Is(err, client.ErrBatchDuplicate) && try < 2:
			l.cv.pending = turns[0].ID // the read waits until it is applied
			rec, err := l.cv.read(ctx)
			if err != nil {
				return "", err
			}
			v, at := matchTurns(rec.ids, l.ids)
			if v != extends {
				return "", fmt.Errorf("conversation %s changed while its turns were recorded (%s at %d)", l.cv.id, v, at)
			}
			l.rec, l.at = rec, at
		default:
			return "", fmt.Errorf("record turns %d-%d of %s: %w", l.at, len(req.turns)-1, l.cv.id, err)
		}
	}
}

// turns are the request's turns from l.at on as the wire contract's.
func (p *Proxy) turns(l *located, key Key, req *request) []schema.Turn {
	var out []schema.Turn
	system := l.cv.system
	for i := l.at; i < len(req.turns); i++ {
		t := &req.turns[i]
		turn := schema.Turn{ID: l.ids[i], ConversationID: l.cv.id, AgentID: key.Agent, ProfileID: p.cfg.ProfileID,
			TS: l.cv.nextTS(), Role: t.role, Content: t.content}
		if req.system != "" && req.system != system {
			turn.SystemPrompt, system = req.system, req.system
		}
		if i == 0 {
			turn.ContinuesFrom = l.continuesFrom
		}
		out = append(out, turn)
	}
	return out
}

// published notes the system prompt the turns recorded.
func (p *Proxy) published(l *located, turns []schema.Turn) {
	for i := range turns {
		if turns[i].SystemPrompt != "" {
			l.cv.system = turns[i].SystemPrompt
		}
	}
}

// partialError is a request whose new turns were recorded only in part:
// the stream takes no atomic batches, and publishing them one by one
// stopped half way. The request is not forwarded (its last recorded turn
// may be a tool call whose result is not), and the client is asked to
// send it again, which records the rest under the same ids.
type partialError struct {
	conv         string
	stored, want int
	err          error
}

func (e *partialError) Error() string {
	return fmt.Sprintf("recorded %d of the request's %d new turns in %s: %v", e.stored, e.want, e.conv, e.err)
}
func (e *partialError) Unwrap() error { return e.err }

// publishEach publishes turns one by one, in order. When it stops after
// some were stored, the error is a *partialError.
func (p *Proxy) publishEach(ctx context.Context, l *located, turns []schema.Turn) error {
	for i := range turns {
		if _, err := p.c.Append(ctx, turns[i]); err != nil {
			err = fmt.Errorf("record turn %s of %s: %w", turns[i].ID, l.cv.id, err)
			if i > 0 {
				return &partialError{conv: l.cv.id, stored: i, want: len(turns), err: err}
			}
			return err
		}
		p.published(l, turns[i:i+1])
	}
	return nil
}

// recordReply records the upstream's reply as the turn after the
// request's, with the provider's usage. It does not wait: the next
// request's read does.
func (p *Proxy) recordReply(ctx context.Context, cv *conv, key Key, pos int, t turnMsg, u *schema.Usage) error {
	cv.mu.Lock()
	defer cv.mu.Unlock()
	turn := schema.Turn{ID: turnID(p.cfg.Secret, cv.id, pos, t.canon), ConversationID: cv.id, AgentID: key.Agent,
		ProfileID: p.cfg.ProfileID, TS: cv.nextTS(), Role: t.role, Content: t.content, Usage: u}
	if _, err := p.c.Append(ctx, turn); err != nil {
		return fmt.Errorf("record the reply in %s: %w", cv.id, err)
	}
	cv.pending = turn.ID
	return nil
}
