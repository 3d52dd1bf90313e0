package engine

import (
	"github.com/google/uuid"

	"github.com/ctxpipe/ctxpipe/schema"
)

// idSpace namespaces derived ids. Changing it would change every derived id,
// which would break idempotency across a deploy: never change it.
var idSpace = uuid.MustParse("6f1d3c1e-2b7a-4c52-9a55-0c7e3d1f8b42")

// DeriveID returns a deterministic UUID for something an input caused (its
// condense id, a marker, an event). Replaying the same input after a crash
// yields the same ids, so duplicates are caught by id downstream. Pass the
// input's Scope, not its bare id: two tenants may send the same id.
func DeriveID(inputID, purpose string) string {
	return uuid.NewSHA1(idSpace, []byte(inputID+"/"+purpose)).String()
}

// Scope is what the ids an input causes are derived from: its id, qualified
// by the tenant it came from. Input ids are unique per tenant only, and the
// ids derived from them (events above all) must be unique across the whole
// service. An input of the service's own account (tenant "") keeps its bare
// id, so its derived ids are what they always were.
func Scope(tenant, inputID string) string {
	if tenant == "" {
		return inputID
	}
	return tenant + "/" + inputID
}

// InputScope is Scope for a decoded input, whose conversation key carries
// its tenant.
func InputScope(in schema.Input) string {
	tenant, _ := schema.SplitKey(in.ConversationID)
	return Scope(tenant, in.ID)
}
