package pipeline

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/store"
)

// payloadMsg is a fetched message as decode reads it: its payload alone.
type payloadMsg struct {
	jetstream.Msg
	data []byte
}

func (m payloadMsg) Data() []byte { return m.data }

// decode's classification: an input over the size limit is too_large, one
// delivered MaxDeliver times is poison (before it is even read), one that
// does not decode is rejected with its decoder's reason, under its own id
// when that is readable and otherwise under one derived from its stream
// sequence; a good one is decoded.
func TestDecodeClassifies(t *testing.T) {
	pr := &preparer{maxInputBytes: 200, maxDeliver: 5, logger: slog.New(slog.DiscardHandler)}
	id := uuid.NewString()
	subject := schema.InputSubject("acme.c1", schema.KindTurn)
	good := `{"id":"` + id + `","conversation_id":"c1","ts":1,"role":"user","content":"hi"}`
	tests := []struct {
		name    string
		data    string
		deliver uint64
		reason  schema.Reason // "" : decoded
		ownID   bool          // the rejection is under the input's id
	}{
		{"a good turn", good, 1, "", false},
		{"a good turn, redelivered", good, 4, "", false},
		{"over the size limit", `{"id":"` + id + `","pad":"` + strings.Repeat("x", 300) + `"}`, 1, schema.ReasonTooLarge, true},
		{"delivered MaxDeliver times", good, 5, schema.ReasonPoison, true},
		{"not JSON, no readable id", `{"id": nope`, 1, schema.ReasonInvalidJSON, false},
	}
	for _, tt := range tests {
		j := &job{msg: payloadMsg{data: []byte(tt.data)}, subject: subject, conv: "acme.c1", seq: 77, deliver: tt.deliver}
		in, rej := pr.decode(j)
		if tt.reason == "" {
			if rej != nil || in.ID != id || in.ConversationID != "acme.c1" {
				t.Errorf("%s: decoded %+v, rejected %+v", tt.name, in, rej)
			}
			continue
		}
		if rej == nil {
			t.Errorf("%s: decoded, want a %s rejection", tt.name, tt.reason)
			continue
		}
		ev, ok := rej.Changes.Events[0].(*schema.InputRejected)
		if !ok || ev.Reason != tt.reason || rej.Input.Status != store.StatusRejected || rej.Input.Reason != string(tt.reason) {
			t.Errorf("%s: rejection %+v (event %+v), want reason %s", tt.name, rej.Input, ev, tt.reason)
		}
		if got := rej.Input.ID == id; got != tt.ownID {
			t.Errorf("%s: rejected under %s, its own id %v, want %v", tt.name, rej.Input.ID, got, tt.ownID)
		}
		// Redelivered, the same input is rejected under the same id.
		if _, again := pr.decode(j); again == nil || again.Input.ID != rej.Input.ID {
			t.Errorf("%s: a second decode rejects under another id", tt.name)
		}
	}
}
