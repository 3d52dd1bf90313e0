package schema_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/ctxpipe/ctxpipe/internal/schematest"
	"github.com/ctxpipe/ctxpipe/schema"
)

// historyRequestSchema compiles #/$defs/request of history.schema.json
// (the reply's definition compiles with it).
func historyRequestSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	compileSchema(t, "history.schema.json", schema.HistorySchemaID) // $id, $schema, meta-schema
	req, _, err := schematest.History(".")
	if err != nil {
		t.Fatalf("compile history.schema.json: %v", err)
	}
	return req
}

// goAcceptsHistoryRequest is the service's verdict on a request's shape:
// decoded as the query handler decodes it, then validated.
func goAcceptsHistoryRequest(data []byte) error {
	var req schema.HistoryRequest
	if err := json.Unmarshal(data, &req); err != nil {
		return err
	}
	return req.Validate()
}

// The schema and the service give the same verdict on history requests
// (the replies are checked against the schema by the pipeline's tests, on
// every reply they read), except for the differences listed, which are
// checked to still differ.
func TestHistorySchemaAgreesOnRequests(t *testing.T) {
	sch := historyRequestSchema(t)
	const id = "0b7f2c2e-3f7e-4a57-9a4e-2b1f0f7b9c11"
	long := strings.Repeat("c", 257)
	for _, data := range []string{
		`{"conversation_id":"c1"}`,
		`{"conversation_id":"c1","view":"full"}`,
		`{"conversation_id":"c1","view":"effective","wait_for":"` + id + `","timeout_ms":5000}`,
		`{"conversation_id":"c1","wait_for":"` + strings.ToUpper(id) + `"}`,
		`{"conversation_id":"c1","limit":100,"cursor":"100.` + id + `"}`,
		`{"conversation_id":"c1","after":42}`,
		`{"conversation_id":"c1","after":0,"limit":10}`,
		`{"conversation_id":"c1","after":9223372036854775807}`,
		`{"conversation_id":"c1","view":null,"wait_for":null,"timeout_ms":null,"limit":null,"cursor":null,"after":null}`,
		`{"conversation_id":"c1","after":5,"limit":0,"cursor":""}`,
		`{"conversation_id":"c1","unknown":{"deep":[1,2,3]}}`,
		`{"conversation_id":"c1","limit":100000}`,
		`{"conversation_id":"` + strings.Repeat("a", 128) + `"}`,
		// refused
		`{}`,
		`{"conversation_id":""}`,
		`{"conversation_id":null}`,
		`{"conversation_id":"_reserved"}`,
		`{"conversation_id":"a.b"}`,
		`{"conversation_id":"` + strings.Repeat("a", 129) + `"}`,
		`{"conversation_id":7}`,
		`{"conversation_id":"c1","view":"hidden"}`,
		`{"conversation_id":"c1","wait_for":"not-a-uuid"}`,
		`{"conversation_id":"c1","wait_for":"` + strings.ReplaceAll(id, "-", "") + `"}`,
		`{"conversation_id":"c1","timeout_ms":-1}`,
		`{"conversation_id":"c1","timeout_ms":9223372036854775808}`,
		`{"conversation_id":"c1","limit":-1}`,
		`{"conversation_id":"c1","limit":100001}`,
		`{"conversation_id":"c1","limit":"10"}`,
		`{"conversation_id":"c1","cursor":"` + long + `"}`,
		`{"conversation_id":"c1","after":-1}`,
		`{"conversation_id":"c1","after":3,"limit":10}`,
		`{"conversation_id":"c1","after":3,"cursor":"10.` + id + `"}`,
		`{"conversation_id":"c1","after":1.5}`,
		`[]`,
		`"c1"`,
	} {
		goErr := goAcceptsHistoryRequest([]byte(data))
		schErr := sch.Validate(instance(t, []byte(data)))
		if (goErr == nil) != (schErr == nil) {
			t.Errorf("%s: the service says %v, the schema %v", data, goErr, schErr)
		}
	}
	// What the schema cannot say the service's way.
	for _, d := range []struct{ why, data string }{
		{"encoding/json matches field names case-insensitively", `{"Conversation_ID":"c1"}`},
		{"encoding/json refuses a fraction part in an integer field; JSON Schema counts 10.0 as an integer", `{"conversation_id":"c1","limit":10.0}`},
		{"the cursor bound is 256 bytes for the service, 256 characters for the schema", `{"conversation_id":"c1","cursor":"` + strings.Repeat("é", 200) + `"}`},
	} {
		goErr := goAcceptsHistoryRequest([]byte(d.data))
		schErr := sch.Validate(instance(t, []byte(d.data)))
		if (goErr == nil) == (schErr == nil) {
			t.Errorf("known difference %q no longer differs (%s): take it out of the schema's description and this list", d.why, d.data)
		}
	}
}
