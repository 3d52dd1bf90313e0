package store

import (
	"container/list"
	"sync"

	"github.com/ctxpipe/ctxpipe/schema"
)

// recent remembers, per conversation, the messages its latest commits
// appended, so that an incremental history read (an agent's read after
// every turn) that needs only those is answered without SQLite. In WAL mode
// a reader connection drops its whole page cache whenever the file changed,
// so under a steady write load nearly every such read would start cold and
// read its pages again.
//
// It is fed by Tx.Commit, after the COMMIT, with what the transaction
// stored, and it only ever describes a committed state: for a conversation
// it holds every message stored with a change sequence above from, up to
// seq, which is the conversation's sequence as the store last committed it
// (this Store is the file's only writer). Anything it cannot vouch for —
// a change that is more than an append (the sequence's reset), bodies that
// came encoded from a changelog record, a gap — restarts the conversation
// at the new sequence, and the read goes to SQLite.
type recent struct {
	mu       sync.Mutex
	convs    map[string]*recentConv
	lru      *list.List // of conversation keys, most recently committed at the front
	bytes    int
	maxBytes int
}

// recentKeep is how many appended messages are kept per conversation: more
// than TailMessages, so that a read whose appended messages carry a tool
// result finds the visible tail before them here too.
const recentKeep = 2 * TailMessages

type recentConv struct {
	// committing counts the transactions of this conversation between
	// their COMMIT and the index's update: SQLite may show them already,
	// so reads go there meanwhile.
	committing int
	seq        int64
	reset      int64 // the sequence's last reset, as SQLite has it
	from       int64
	msgs       []recentMsg // stored with seq > from, in position order
	bytes      int
	elem       *list.Element
}

type recentMsg struct {
	m    schema.Message // as stored: the tags and the count in their fields
	body []byte         // the stored body
	seq  int64
}

// appended is what a transaction stored for one conversation.
type appended struct {
	prev    int64 // the conversation's sequence before the transaction
	unknown bool  // the transaction did more than append, or its messages came encoded
	msgs    []recentMsg
}

func newRecent(maxBytes int) *recent {
	return &recent{convs: map[string]*recentConv{}, lru: list.New(), maxBytes: maxBytes}
}

// committed records a committed transaction's changes to conversation conv:
// its sequence is now seq, and the sequence's last reset reset.
func (r *recent) committed(conv string, seq, reset int64, a *appended) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.convs[conv]
	if c == nil {
		c = &recentConv{elem: r.lru.PushFront(conv)}
		r.convs[conv] = c
		c.restart(a.prev)
	} else {
		r.lru.MoveToFront(c.elem)
		r.bytes -= c.bytes
		if c.seq != a.prev {
			// Not the state this transaction started from (evicted and
			// back, or a commit that did not pass here): start again.
			c.restart(a.prev)
		}
	}
	c.reset = reset
	if a.unknown {
		c.restart(seq)
	} else {
		c.msgs = append(c.msgs, a.msgs...)
		c.seq = seq
		c.trim()
	}
	r.bytes += c.bytes
	for r.bytes > r.maxBytes && r.lru.Len() > 0 {
		old := r.lru.Remove(r.lru.Back()).(string)
		r.bytes -= r.convs[old].bytes
		delete(r.convs, old)
	}
}

// committing marks (delta 1) or unmarks (delta -1) conversations whose
// transaction is about to commit: see recentConv.committing.
func (r *recent) committing(convs []string, delta int) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, conv := range convs {
		if c := r.convs[conv]; c != nil {
			c.committing = max(0, c.committing+delta)
		}
	}
}

// restart empties c at sequence seq: it vouches for nothing before it.
func (c *recentConv) restart(seq int64) {
	c.seq, c.from, c.msgs, c.bytes = seq, seq, nil, 0
}

// trim keeps at most recentKeep messages, dropping whole sequences from the
// oldest, and counts the bytes kept.
func (c *recentConv) trim() {
	drop := 0
	for len(c.msgs)-drop > recentKeep {
		s := c.msgs[drop].seq
		for drop < len(c.msgs) && c.msgs[drop].seq == s {
			drop++
		}
		c.from = s
	}
	if drop > 0 {
		// A copy, so that the dropped messages are not kept alive by the
		// array behind the slice.
		c.msgs = append([]recentMsg(nil), c.msgs[drop:]...)
	}
	c.bytes = 0
	for _, m := range c.msgs {
		c.bytes += 2*len(m.body) + 256 // the body, about as much decoded, and the rest
	}
}

// read answers an incremental read of conv after sequence after as
// ReadHistory would from SQLite, when what it holds is enough: ok is false
// otherwise.
func (r *recent) read(conv string, visibleOnly bool, after int64) (h History, ok bool) {
	if r == nil || after <= 0 {
		return h, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.convs[conv]
	if c == nil || c.committing > 0 || after < c.from || after > c.seq {
		return h, false
	}
	i := len(c.msgs)
	for i > 0 && c.msgs[i-1].seq > after {
		i--
	}
	added := c.msgs[i:]
	h = History{Bodies: map[string][]byte{}, Incremental: true, Seq: c.seq, ResetSeq: c.reset}
	var msgs []schema.Message
	if len(added) > 0 && visibleOnly && hasToolResultIn(added) {
		// The visible messages before them, as many as are here up to
		// TailMessages: appended since the last reset, none is hidden.
		// Fewer than SQLite's tail when fewer are held (after a reset such
		// as a condense, or a restart), and then its last ones: enough if
		// they hold every call the results answer, since the caller looks
		// no further. Requiring the whole
		// tail here sent the dozen tool-result reads after every condense
		// to SQLite, a scan of the conversation's hidden messages each (11 %
		// of the agent workload's reads at 200 turns per conversation).
		tail := c.msgs[max(0, i-TailMessages):i]
		if len(tail) < TailMessages && !callsHeld(tail, added) {
			return History{}, false
		}
		for _, m := range tail {
			msgs = append(msgs, m.m)
		}
	}
	for _, m := range added {
		msgs = append(msgs, m.m)
		h.Bodies[m.m.ID] = m.body
	}
	h.Messages = msgs
	return h, true
}

// callsHeld tells whether every tool result in added answers a call made by
// an assistant message before it, in tail or in added.
func callsHeld(tail, added []recentMsg) bool {
	calls := map[string]bool{}
	for k, ms := range [][]recentMsg{tail, added} {
		for i := range ms {
			m := &ms[i].m
			for _, b := range m.Content.Blocks {
				switch {
				case b.Type == schema.BlockToolUse && m.Role == schema.RoleAssistant:
					calls[b.ID] = true
				case b.Type == schema.BlockToolResult && k == 1 && !calls[b.ToolUseID]:
					return false
				}
			}
		}
	}
	return true
}

func hasToolResultIn(ms []recentMsg) bool {
	for i := range ms {
		if ms[i].m.Content.HasBlock(schema.BlockToolResult) {
			return true
		}
	}
	return false
}
