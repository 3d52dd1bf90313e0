package store

import (
	"sync"

	"github.com/ctxpipe/ctxpipe/schema"
)

// DefaultMessageCacheBytes bounds the decoded-message cache.
const DefaultMessageCacheBytes = 64 << 20

// messageCache keeps decoded message bodies by message id. A body never
// changes once stored (the tags live in their own columns), so an entry can
// never be stale; a rewind only leaves entries unused. Agents read their
// history after nearly every turn, and without this each read decoded the
// same JSON again. It is bounded by the size of the bodies it holds and
// evicts at random (Go's map order), which keeps it simple and fair to
// every conversation.
type messageCache struct {
	mu    sync.Mutex
	m     map[string]cached
	bytes int
	max   int
}

type cached struct {
	msg  schema.Message
	size int
}

func newMessageCache(maxBytes int) *messageCache {
	return &messageCache{m: map[string]cached{}, max: maxBytes}
}

func (c *messageCache) get(id string) (schema.Message, bool) {
	if c == nil {
		return schema.Message{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[id]
	return e.msg, ok
}

func (c *messageCache) put(id string, m schema.Message, size int) {
	if c == nil || size > c.max/16 {
		return // one huge body must not flush the whole cache
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.m[id]; ok {
		c.bytes -= old.size
	}
	c.m[id] = cached{m, size}
	c.bytes += size
	for old := range c.m {
		if c.bytes <= c.max {
			break
		}
		if old == id {
			continue // keep what was just read: it is about to be read again
		}
		c.bytes -= c.m[old].size
		delete(c.m, old)
	}
}
