package stages

import "github.com/google/uuid"

// idSpace namespaces derived ids. Changing it would change every derived id,
// which would break idempotency across a deploy: never change it.
var idSpace = uuid.MustParse("6f1d3c1e-2b7a-4c52-9a55-0c7e3d1f8b42")

// DeriveID returns a deterministic UUID for something an input caused (its
// condense id, a marker, an event). Replaying the same input after a crash
// yields the same ids, so duplicates are caught by id downstream.
func DeriveID(inputID, purpose string) string {
	return uuid.NewSHA1(idSpace, []byte(inputID+"/"+purpose)).String()
}
