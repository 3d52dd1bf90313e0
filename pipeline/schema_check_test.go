package pipeline_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/ctxpipe/ctxpipe/schema"
)

// historySchemas compiles schema/history.schema.json (with the turn schema
// its messages refer to) once: the request and the reply definitions.
var historySchemas = sync.OnceValues(func() ([2]*jsonschema.Schema, error) {
	c := jsonschema.NewCompiler()
	var history string
	for _, f := range []string{"../schema/turn.schema.json", "../schema/history.schema.json"} {
		data, err := os.ReadFile(f)
		if err != nil {
			return [2]*jsonschema.Schema{}, err
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
		if err != nil {
			return [2]*jsonschema.Schema{}, err
		}
		abs, err := filepath.Abs(f)
		if err != nil {
			return [2]*jsonschema.Schema{}, err
		}
		if err := c.AddResource(abs, doc); err != nil {
			return [2]*jsonschema.Schema{}, err
		}
		history = abs // the last; its $ref to ctxpipe.turn.v1 resolves beside it
	}
	var out [2]*jsonschema.Schema
	for i, def := range []string{"request", "reply"} {
		sch, err := c.Compile(history + "#/$defs/" + def)
		if err != nil {
			return out, err
		}
		out[i] = sch
	}
	return out, nil
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
