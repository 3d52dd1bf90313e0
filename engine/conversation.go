package engine

import (
	"context"
	"fmt"

	"github.com/ctxpipe/ctxpipe/schema"
)

// Conversation manages one conversation's context in process, without the
// service: it keeps the full history in memory and applies each input's
// Changes exactly as the store does.
type Conversation struct {
	Profile  schema.Profile
	Engine   *Engine
	State    schema.ConversationState
	Messages []schema.Message // full history, hidden messages included
	Events   []schema.Event   // every event, oldest first
	seen     map[string]bool
}

// NewConversation starts an empty conversation.
func NewConversation(id string, p schema.Profile, e *Engine) *Conversation {
	return &Conversation{
		Profile: p,
		Engine:  e,
		State:   schema.ConversationState{ConversationID: id, ProfileID: p.ID},
		seen:    map[string]bool{},
	}
}

// Apply runs one input and returns the events it caused. An input whose id
// was already applied changes nothing and returns no events.
func (c *Conversation) Apply(ctx context.Context, in schema.Input) ([]schema.Event, error) {
	if in.ConversationID != c.State.ConversationID {
		return nil, schema.Errorf(schema.ReasonConversationMismatch, "input for %q applied to %q", in.ConversationID, c.State.ConversationID)
	}
	if c.seen[in.ID] {
		return nil, nil
	}
	ch, err := c.Engine.Apply(ctx, c.State, memHistory{c}, &c.Profile, in)
	if err != nil {
		return nil, err
	}
	c.seen[in.ID] = true
	c.Messages = Apply(c.Messages, ch)
	c.State = ch.State
	c.Events = append(c.Events, ch.Events...)
	return ch.Events, nil
}

// Append applies a turn.
func (c *Conversation) Append(ctx context.Context, t schema.Turn) ([]schema.Event, error) {
	if t.ConversationID == "" {
		t.ConversationID = c.State.ConversationID
	}
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return c.Apply(ctx, schema.Input{Kind: schema.KindTurn, ID: t.ID, ConversationID: t.ConversationID, TS: t.TS, Turn: &t})
}

// Effective is the history to send to the model.
func (c *Conversation) Effective() []schema.Message { return EffectiveHistory(c.Messages) }

// memHistory serves the engine from the conversation's memory.
type memHistory struct{ c *Conversation }

func (h memHistory) Messages(context.Context) ([]schema.Message, error) { return h.c.Messages, nil }

func (h memHistory) ContextEvents(context.Context) ([]schema.ContextEventRef, error) {
	return ContextEventRefs(h.c.Events), nil
}

// ContextEventRefs picks the condense and truncation events a rewind may undo.
func ContextEventRefs(evs []schema.Event) []schema.ContextEventRef {
	var out []schema.ContextEventRef
	for _, e := range evs {
		switch e := e.(type) {
		case *schema.CondenseContext:
			out = append(out, schema.ContextEventRef{Type: e.Type, ID: e.CondenseID, TS: e.TS})
		case *schema.SlidingWindowTruncation:
			out = append(out, schema.ContextEventRef{Type: e.Type, ID: e.TruncationID, TS: e.TS})
		}
	}
	return out
}

// String summarizes the conversation for logs and examples.
func (c *Conversation) String() string {
	return fmt.Sprintf("%s: %d messages (%d effective), %d context tokens",
		c.State.ConversationID, len(c.Messages), len(c.Effective()), c.State.ContextTokens)
}
