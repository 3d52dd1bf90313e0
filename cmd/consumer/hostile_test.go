package main

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ctxpipe/ctxpipe/schema"
)

// A turn naming a profile id of kilobytes is rejected unknown_profile, and
// the service goes on serving every tenant: looking such an id up in the
// profiles bucket would make a subject longer than the server's control
// line, the server would close the service's connection, and each
// redelivery after a restart would do it again.
func TestLongProfileIDIsRejected(t *testing.T) {
	m := mustRunMain(t, t.TempDir())
	c := connectAs(t, m.ns.ClientURL(), "acme-agent")
	other := connectAs(t, m.ns.ClientURL(), "globex-agent")
	const conv = "long-profile"
	ts := time.Now().UnixMilli()
	for _, n := range []int{schema.MaxProfileIDBytes + 1, 4050, 70_000} {
		bad := schema.Turn{ID: uuid.NewString(), ConversationID: conv, ProfileID: strings.Repeat("x", n), TS: ts,
			Role: schema.RoleUser, Content: schema.TextContent("hello")}
		ts++
		c.publishTurn(bad)
		_, err := c.history(conv, schema.ViewFull, bad.ID, 20*time.Second)
		if qe, ok := err.(*schema.QueryErrorBody); !ok || qe.Code != schema.QueryInputRejected || !strings.Contains(qe.Message, string(schema.ReasonUnknownProfile)) {
			t.Fatalf("a %d-byte profile id: %v, want input_rejected (unknown_profile)", n, err)
		}
	}
	// Both tenants' turns still apply.
	for _, cl := range []*client{c, other} {
		ok := schema.Turn{ID: uuid.NewString(), ConversationID: conv, TS: ts, Role: schema.RoleUser, Content: schema.TextContent("still here")}
		ts++
		cl.publishTurn(ok)
		if msgs := cl.mustHistory(conv, schema.ViewFull, ok.ID); len(msgs) != 1 || msgs[0].ID != ok.ID {
			t.Fatalf("after the long profile ids: %d messages", len(msgs))
		}
	}
}
