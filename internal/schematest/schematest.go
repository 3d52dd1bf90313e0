// Package schematest compiles the repository's JSON Schema files for the
// tests that hold the Go types to them.
package schematest

import (
	"bytes"
	"os"
	"path/filepath"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// History compiles history.schema.json from dir (the schema directory), with
// turn.schema.json beside it, which its messages refer to, and returns the
// request and the reply definitions.
func History(dir string) (request, reply *jsonschema.Schema, err error) {
	c := jsonschema.NewCompiler()
	var history string
	for _, name := range []string{"turn.schema.json", "history.schema.json"} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, nil, err
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
		if err != nil {
			return nil, nil, err
		}
		// The last added; its $ref to turn.schema.json resolves beside it.
		if history, err = filepath.Abs(filepath.Join(dir, name)); err != nil {
			return nil, nil, err
		}
		if err := c.AddResource(history, doc); err != nil {
			return nil, nil, err
		}
	}
	if request, err = c.Compile(history + "#/$defs/request"); err != nil {
		return nil, nil, err
	}
	if reply, err = c.Compile(history + "#/$defs/reply"); err != nil {
		return nil, nil, err
	}
	return request, reply, nil
}
