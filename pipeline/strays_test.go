package pipeline_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/bus"
	"github.com/ctxpipe/ctxpipe/internal/natstest"
	"github.com/ctxpipe/ctxpipe/pipeline"
	"github.com/ctxpipe/ctxpipe/schema"
)

// stray is an input published on a subject with a wildcard token, and
// where its rejection must be filed.
type stray struct {
	subject string
	conv    string // the conversation key the input_rejected event is filed under
	reason  schema.Reason
}

// Inputs whose subject has a token that is a literal wildcard, published
// by a client of the service's own account on a server without nats.conf:
// CTX_IN stores every one of them, most where no partition's consumer
// reads, and each must be rejected with an input_rejected event under its
// own id, and then be gone from the stream. Some are there before the
// service starts, as they are in a stream that stored them before strays
// were looked for; the others come while it runs. The partitions go on.
func TestStraysAreRejected(t *testing.T) {
	before := []stray{
		{"ctx.in.acme.>.turn", "acme._invalid", schema.ReasonBadConversationID},
		{"ctx.in.globex.c1.*", "globex._invalid", schema.ReasonUnknownKind},
	}
	while := []stray{
		{"ctx.in.*.turn", "_invalid", schema.ReasonBadConversationID}, // read by the shared partition
		{"ctx.in.c1.*", "c1", schema.ReasonUnknownKind},               // the same
		{"ctx.in.acme.*.turn", "acme._invalid", schema.ReasonBadConversationID},
		{"ctx.in.acme.>.overflow", "acme._invalid", schema.ReasonBadConversationID},
		{"ctx.in.globex.>.condense", "globex._invalid", schema.ReasonBadConversationID},
		{"ctx.in.*.*.condense", "_invalid", schema.ReasonBadSubject},
		{"ctx.in.>.c1.rewind", "_invalid", schema.ReasonBadSubject},
		// Filed under no conversation, though the subject names one.
		{"ctx.in.acme.c1.>", "acme._invalid", schema.ReasonUnknownKind},
		{"ctx.in.acme.c1.*", "acme._invalid", schema.ReasonUnknownKind},
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, url := natstest.Run(t)
	js, err := jetstream.New(natstest.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	if err := bus.EnsureStreams(ctx, js); err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{} // subject → the id its payload carries
	send := func(s stray) {
		t.Helper()
		id := uuid.NewString()
		ids[s.subject] = id
		payload := fmt.Appendf(nil, `{"id":%q,"conversation_id":"c1","ts":1,"role":"user","content":"hi"}`, id)
		// Raw: bus.PublishInput refuses a wildcard token itself.
		if _, err := js.Publish(ctx, s.subject, payload); err != nil {
			t.Fatalf("publish %s: %v", s.subject, err)
		}
	}
	for _, s := range before {
		send(s)
	}
	h := startOn(t, url, pipeline.Config{Lanes: 4, AckWait: 5 * time.Second, MaxDeliver: 5, RetryBudget: time.Second,
		StrayInterval: 100 * time.Millisecond}, nil)
	for _, s := range while {
		send(s)
	}
	ok := h.turn("after-strays", schema.RoleUser, 5)
	if msgs := h.history("after-strays", schema.ViewFull, ok.ID); len(msgs) != 1 {
		t.Fatalf("a turn after the strays: %d messages", len(msgs))
	}
	for _, s := range append(before, while...) {
		waitFor(t, func() bool {
			evs, err := h.store.Events(ctx, s.conv)
			if err != nil {
				t.Fatal(err)
			}
			for _, ev := range evs {
				if r, isRej := ev.(*schema.InputRejected); isRej && r.InputID == ids[s.subject] {
					if r.Reason != s.reason || r.Subject != s.subject {
						t.Fatalf("%s: rejected %s on %s, want %s", s.subject, r.Reason, r.Subject, s.reason)
					}
					return true
				}
			}
			return false
		})
	}
	// And then gone from CTX_IN: nothing is left there that no partition
	// reads.
	st, err := js.Stream(ctx, bus.StreamIn)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(bus.StraySubjects))
		return err == nil && len(info.State.Subjects) == 0
	})
	if n := h.metrics.Value("ctxpipe_inputs_stray_total", ""); n != float64(len(before)+len(while)-2) {
		t.Fatalf("ctxpipe_inputs_stray_total = %v, want %d", n, len(before)+len(while)-2)
	}
}
