package schema_test

import (
	"testing"

	"github.com/ctxpipe/ctxpipe/schema"
)

// A tenant's subjects reach the service as ctx.in.<tenant>.<conv>.<kind>;
// payloads name the conversation without the tenant, and the service knows
// it by its key, so two tenants' "task-42" never meet.
func TestTenantSubjects(t *testing.T) {
	for _, tenant := range []string{"acme", "globex"} {
		subject := schema.InputSubjectPrefix + tenant + ".task-42.turn"
		in, err := schema.DecodeInput(subject, turnJSON(t, nil))
		if err != nil {
			t.Fatalf("%s: %v", subject, err)
		}
		if want := tenant + ".task-42"; in.ConversationID != want || in.Turn.ConversationID != want {
			t.Fatalf("%s: conversation %q / %q, want the key %q", subject, in.ConversationID, in.Turn.ConversationID, want)
		}
		if got, conv := schema.SplitKey(in.ConversationID); got != tenant || conv != "task-42" {
			t.Fatalf("SplitKey(%q) = %q, %q", in.ConversationID, got, conv)
		}
		if schema.SubjectTenant(subject) != tenant {
			t.Fatalf("SubjectTenant(%q) = %q", subject, schema.SubjectTenant(subject))
		}
	}
	for key, ok := range map[string]bool{
		"task-42": true, "acme.task-42": true, "acme._invalid": true, "_invalid": true,
		"a.b.c": false, "_acme.x": false, ".x": false, "acme.": false, "": false, "acme.a b": false,
	} {
		if schema.ValidConversationKey(key) != ok {
			t.Errorf("ValidConversationKey(%q) = %v, want %v", key, !ok, ok)
		}
	}
}

// A turn's continues_from names a conversation as its conversation_id does,
// without the tenant: it becomes the key in the subject's tenant, so a link
// can only ever lead to a conversation of the same tenant.
func TestContinuesFromStaysInTheTenant(t *testing.T) {
	for subject, want := range map[string]string{
		schema.InputSubjectPrefix + "acme.task-42.turn": "acme.task-41",
		schema.InputSubjectPrefix + "task-42.turn":      "task-41",
	} {
		in, err := schema.DecodeInput(subject, turnJSON(t, map[string]any{"continues_from": "task-41"}))
		if err != nil {
			t.Fatalf("%s: %v", subject, err)
		}
		if in.Turn.ContinuesFrom != want {
			t.Errorf("%s: continues_from %q, want %q", subject, in.Turn.ContinuesFrom, want)
		}
	}
	// Naming another tenant's key is not a conversation id.
	_, err := schema.DecodeInput(schema.InputSubjectPrefix+"acme.task-42.turn", turnJSON(t, map[string]any{"continues_from": "globex.task-41"}))
	if schema.ReasonOf(err) != schema.ReasonBadConversationID {
		t.Errorf("continues_from naming another tenant's key: %v, want bad_conversation_id", err)
	}
}
