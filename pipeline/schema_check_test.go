package pipeline_test

import (
	"bytes"
	"encoding/json"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/ctxpipe/ctxpipe/internal/schematest"
	"github.com/ctxpipe/ctxpipe/schema"
)

// historySchemas are the request and reply definitions of
// schema/history.schema.json, compiled once.
var historySchemas = sync.OnceValues(func() ([2]*jsonschema.Schema, error) {
	req, rep, err := schematest.History("../schema")
	return [2]*jsonschema.Schema{req, rep}, err
})

// checkHistoryJSON validates a history request the service accepted, and
// its reply unless it is an error, against history.schema.json: every reply
// the tests read is a case of the published contract.
func checkHistoryJSON(t testing.TB, req, reply []byte) {
	t.Helper()
	schemas, err := historySchemas()
	if err != nil {
		t.Fatalf("history.schema.json: %v", err)
	}
	var qe schema.QueryError
	if json.Unmarshal(reply, &qe) == nil && qe.Error.Code != "" {
		return
	}
	for i, data := range [][]byte{req, reply} {
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
		if err != nil {
			t.Fatalf("not JSON: %v\n%s", err, data)
		}
		if err := schemas[i].Validate(v); err != nil {
			t.Fatalf("history.schema.json refuses this %s:\n%v\n%.2000s", []string{"request", "reply"}[i], err, data)
		}
	}
}
