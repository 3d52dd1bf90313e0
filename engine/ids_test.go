package engine

import (
	"testing"

	"github.com/ctxpipe/ctxpipe/schema"
)

// The ids an input causes are its tenant's: the same input id from two
// tenants derives two sets of ids, and an input of the service's own
// account derives what it always did from its bare id.
func TestScopeKeepsTenantsApart(t *testing.T) {
	const id = "0b6c7a9e-1d2f-4c3b-9a8e-7f6d5c4b3a21"
	tests := []struct {
		conv, want string
	}{
		{"c1", id},
		{"acme.c1", "acme/" + id},
		{"acme.c2", "acme/" + id},
		{"globex.c1", "globex/" + id},
	}
	seen := map[string]string{}
	for _, tt := range tests {
		in := schema.Input{ID: id, ConversationID: tt.conv}
		got := InputScope(in)
		if got != tt.want {
			t.Errorf("InputScope(%s) = %q, want %q", tt.conv, got, tt.want)
		}
		ev := DeriveID(got, "event/condense_context")
		if prev, ok := seen[ev]; ok && prev != got {
			t.Errorf("%s and %s derive the same event id", prev, got)
		}
		seen[ev] = got
	}
	if len(seen) != 3 {
		t.Errorf("%d distinct event ids, want 3 (own account, acme, globex)", len(seen))
	}
	if DeriveID(Scope("", id), "condense") != DeriveID(id, "condense") {
		t.Error("the service's own inputs no longer derive their ids from the bare id")
	}
}
