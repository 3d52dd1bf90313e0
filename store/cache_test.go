package store

import (
	"fmt"
	"testing"

	"github.com/ctxpipe/ctxpipe/schema"
)

func TestMessageCacheIsBounded(t *testing.T) {
	c := newMessageCache(16 * 1000)
	for i := 0; i < 1000; i++ {
		c.put(fmt.Sprint(i), schema.Message{Tokens: i}, 100)
		if c.bytes > c.max {
			t.Fatalf("after %d puts: %d bytes cached, bound %d", i+1, c.bytes, c.max)
		}
	}
	if len(c.m) == 0 || len(c.m) > 160 {
		t.Fatalf("%d entries", len(c.m))
	}
	if m, ok := c.get("999"); !ok || m.Tokens != 999 {
		t.Fatal("the newest entry is always kept")
	}
	c.put("huge", schema.Message{}, c.max/16+1)
	if _, ok := c.get("huge"); ok {
		t.Fatal("a body over a sixteenth of the bound is not cached")
	}
	var off *messageCache
	off.put("x", schema.Message{}, 1)
	if _, ok := off.get("x"); ok {
		t.Fatal("a nil cache caches nothing")
	}
}
