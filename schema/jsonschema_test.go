package schema_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/ctxpipe/ctxpipe/schema"
)

// The JSON Schema files are a second statement of the wire contract, for
// agents that are not written in Go. These tests hold the two statements to
// each other: on every example the schema and the Go decoder give the same
// verdict, and every event the Go types produce satisfies event.schema.json.

// compileSchema compiles one of the schema files and checks that its $id is
// the constant the Go code publishes. Compiling also validates the file
// against the draft 2020-12 meta-schema.
func compileSchema(t testing.TB, file, wantID string) *jsonschema.Schema {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var head struct {
		Schema string `json:"$schema"`
		ID     string `json:"$id"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if head.ID != wantID {
		t.Errorf("%s: $id = %q, want %q", file, head.ID, wantID)
	}
	if head.Schema != "https://json-schema.org/draft/2020-12/schema" {
		t.Errorf("%s: $schema = %q, want draft 2020-12", file, head.Schema)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	abs, err := filepath.Abs(file)
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource(abs, doc); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	sch, err := c.Compile(abs)
	if err != nil {
		t.Fatalf("compile %s: %v", file, err)
	}
	return sch
}

// instance parses data the way the validator wants it (numbers as json.Number,
// so that int64 bounds are checked exactly).
func instance(t testing.TB, data []byte) any {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("instance is not JSON: %v", err)
	}
	return v
}

// exampleFiles lists dir/*.json, sorted, and fails when there are none so a
// moved directory cannot make a test pass vacuously.
func exampleFiles(t testing.TB, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no examples in %s", dir)
	}
	sort.Strings(files)
	return files
}

// turnSubject is the subject a turn example is decoded on: its own
// conversation, or a valid stand-in when the example's conversation id is the
// fault under test (so the turn's own validation, not subject parsing, is
// what rejects it).
func turnSubject(data []byte) string {
	var p struct {
		ConversationID string `json:"conversation_id"`
	}
	_ = json.Unmarshal(data, &p)
	conv := p.ConversationID
	if !schema.ValidConversationID(conv) {
		conv = "x"
	}
	return schema.InputSubject(conv, schema.KindTurn)
}

// decodeTurnFile runs both validators on one example. Bytes that are not
// UTF-8 are not JSON text (RFC 8259, section 8.1), so they fail the schema
// side before validation: the validator's parser, like encoding/json, would
// quietly read them as U+FFFD.
func decodeTurnFile(t *testing.T, sch *jsonschema.Schema, file string) (data []byte, schemaErr, goErr error) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if utf8.Valid(data) {
		schemaErr = sch.Validate(instance(t, data))
	} else {
		schemaErr = errors.New("not UTF-8, so not JSON text")
	}
	_, goErr = schema.DecodeInput(turnSubject(data), data)
	return data, schemaErr, goErr
}

func TestTurnSchemaAgreesOnValidExamples(t *testing.T) {
	sch := compileSchema(t, "turn.schema.json", schema.TurnSchemaID)
	for _, file := range exampleFiles(t, "testdata/turns/valid") {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".json"), func(t *testing.T) {
			_, schemaErr, goErr := decodeTurnFile(t, sch, file)
			if schemaErr != nil {
				t.Errorf("schema rejects a valid example: %v", schemaErr)
			}
			if goErr != nil {
				t.Errorf("DecodeInput rejects a valid example: %v", goErr)
			}
		})
	}
}

// Invalid examples are named <reason>__<what>.json: both validators must
// reject them and the Go decoder must say why with that reason.
func TestTurnSchemaAgreesOnInvalidExamples(t *testing.T) {
	sch := compileSchema(t, "turn.schema.json", schema.TurnSchemaID)
	for _, file := range exampleFiles(t, "testdata/turns/invalid") {
		name := strings.TrimSuffix(filepath.Base(file), ".json")
		t.Run(name, func(t *testing.T) {
			want, _, ok := strings.Cut(name, "__")
			if !ok {
				t.Fatalf("invalid example %s is not named <reason>__<what>.json", file)
			}
			_, schemaErr, goErr := decodeTurnFile(t, sch, file)
			if schemaErr == nil {
				t.Errorf("schema accepts an invalid example")
			}
			if goErr == nil {
				t.Fatalf("DecodeInput accepts an invalid example")
			}
			if got := schema.ReasonOf(goErr); got != schema.Reason(want) {
				t.Errorf("DecodeInput reason = %q (%v), want %q", got, goErr, want)
			}
		})
	}
}

// TestTurnSchemaKnownDifferences pins the examples on which the two
// validators disagree today, with the reason for each. When one side changes
// so that they agree, this test fails and says where to move the example.
func TestTurnSchemaKnownDifferences(t *testing.T) {
	known := map[string]struct {
		schemaOK, goOK bool
		why            string
	}{
		"content_missing": {false, true,
			"the schema requires content; the Go decoder reads a missing content as the empty string"},
		"agent_id_null": {false, true,
			"the schema types agent_id as a string; encoding/json treats null as absent for every field"},
		"field_name_case": {false, true,
			"encoding/json matches field names case-insensitively, so Go reads \"Id\" as id"},
		"ts_integral_float": {true, false,
			"JSON Schema calls 1732250000000.0 an integer; encoding/json will not put it into an int64"},
		"usage_sum_over_cap": {true, false,
			"JSON Schema bounds each usage count but cannot add them; Turn.Validate bounds the sum too (bad_usage)"},
		"continues_from_itself": {true, false,
			"JSON Schema cannot compare continues_from with conversation_id; Turn.Validate refuses a conversation continuing itself (bad_conversation_id)"},
	}
	sch := compileSchema(t, "turn.schema.json", schema.TurnSchemaID)
	seen := map[string]bool{}
	for _, file := range exampleFiles(t, "testdata/turns/divergent") {
		name := strings.TrimSuffix(filepath.Base(file), ".json")
		seen[name] = true
		t.Run(name, func(t *testing.T) {
			k, ok := known[name]
			if !ok {
				t.Fatalf("%s is not listed in this test's table of known differences", file)
			}
			_, schemaErr, goErr := decodeTurnFile(t, sch, file)
			if (schemaErr == nil) != k.schemaOK || (goErr == nil) != k.goOK {
				t.Errorf("verdicts changed (schema ok=%v, Go ok=%v; recorded %v, %v: %s); "+
					"if they now agree, move the example to valid/ or invalid/ and drop it from this table",
					schemaErr == nil, goErr == nil, k.schemaOK, k.goOK, k.why)
			}
		})
	}
	for name := range known {
		if !seen[name] {
			t.Errorf("known difference %q has no example in testdata/turns/divergent", name)
		}
	}
}

// TestTurnSchemaAcceptsTranscripts validates real turns against the schema;
// schema_test.go checks the same lines with DecodeInput. A sample keeps the
// test fast under -race: the first turns of every file, which include the
// long task prompts, tool calls, results and reasoning blocks.
func TestTurnSchemaAcceptsTranscripts(t *testing.T) {
	sch := compileSchema(t, "turn.schema.json", schema.TurnSchemaID)
	const perFile = 12
	files := transcriptFiles(t)
	n := 0
	for _, file := range files {
		f, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 16<<20)
		for line := 1; line <= perFile && sc.Scan(); line++ {
			if err := sch.Validate(instance(t, sc.Bytes())); err != nil {
				t.Errorf("%s:%d: schema rejects a real turn: %v", filepath.Base(file), line, err)
			}
			n++
		}
		if err := sc.Err(); err != nil {
			t.Errorf("%s: %v", file, err)
		}
		f.Close()
	}
	if n < len(files)*2 {
		t.Errorf("validated only %d lines from %d files", n, len(files))
	}
}

// sampleEvents is one realistic event of each type, as the engine builds them.
func sampleEvents() []schema.Event {
	h := func(typ schema.EventType) schema.EventHeader {
		return schema.EventHeader{
			ID:             "5f0d8c1e-2b3a-5c4d-8e9f-0a1b2c3d4e5f",
			Type:           typ,
			ConversationID: "task-42",
			TS:             1732250000000,
			InputID:        "0b6c7a9e-4f0e-4a7b-9a51-2f1c3d4e5f60",
		}
	}
	rejected := h(schema.EventInputRejected)
	rejected.InputID = "" // the rejected payload had no readable id
	return []schema.Event{
		&schema.CondenseContext{EventHeader: h(schema.EventCondenseContext),
			CondenseID: "9d1c7f1a-6a0b-5e54-9b1e-3c8f2b9a7d10", Summary: "We fixed <the> parser & tests.",
			Cost: 0.0123, PrevContextTokens: 150000, NewContextTokens: 21000, MessagesCondensed: 40,
			Trigger: schema.TriggerAuto, Model: "gpt-4o-mini", Strategy: string(schema.StrategyKeepTail),
			Instructions: "keep the failing test names"},
		&schema.SlidingWindowTruncation{EventHeader: h(schema.EventSlidingWindowTruncation),
			TruncationID: "1b2c3d4e-5f60-5718-8a9b-0c1d2e3f4a5b", MessagesRemoved: 10,
			PrevContextTokens: 190000, NewContextTokens: 120000},
		&schema.ContextManaging{EventHeader: h(schema.EventContextManaging),
			Trigger: schema.TriggerManual, ContextTokens: 150000, ContextWindow: 200000, Threshold: 75},
		&schema.CondenseFailed{EventHeader: h(schema.EventCondenseFailed),
			Error: schema.ReasonContextGrew, Message: "summary made the context larger", Cost: 0.01,
			Trigger: schema.TriggerForced},
		&schema.Rewind{EventHeader: h(schema.EventRewind), CutoffTS: 1732249990000, IncludeTarget: true,
			RemovedCondenseIDs: []string{"9d1c7f1a-6a0b-5e54-9b1e-3c8f2b9a7d10"}, RemovedTruncationIDs: []string{},
			RemovedMaskIDs:  []string{"7a1c7f1a-6a0b-5e54-9b1e-3c8f2b9a7d11"},
			MessagesRemoved: 3, MessagesRestored: 40},
		&schema.InputRejected{EventHeader: rejected, Reason: schema.ReasonInvalidJSON,
			Message: "payload is not valid JSON", Subject: "ctx.in.task-42.turn"},
		&schema.ToolResultsMasked{EventHeader: h(schema.EventToolResultsMasked),
			MaskID: "7a1c7f1a-6a0b-5e54-9b1e-3c8f2b9a7d11", Count: 12, MessagesMasked: 9,
			PrevContextTokens: 22400, NewContextTokens: 9100, Trigger: schema.TriggerAuto},
		&schema.ConversationForked{EventHeader: h(schema.EventConversationForked), ContinuesFrom: "task-41"},
		&schema.CondenseFailed{EventHeader: h(schema.EventCondenseFailed),
			Error: schema.ReasonNothingToReduce, CondenseError: schema.ReasonNotEnoughMessages,
			Message: "the condense failed (not_enough_messages: …), and nothing is left to truncate", Trigger: schema.TriggerForced},
	}
}

func TestEventSchemaAcceptsGoEvents(t *testing.T) {
	sch := compileSchema(t, "event.schema.json", schema.EventSchemaID)
	types := map[schema.EventType]bool{}
	for _, e := range sampleEvents() {
		typ := e.Header().Type
		types[typ] = true
		t.Run(string(typ), func(t *testing.T) {
			data, err := schema.Marshal(e)
			if err != nil {
				t.Fatal(err)
			}
			if err := sch.Validate(instance(t, data)); err != nil {
				t.Errorf("schema rejects %s", data)
				t.Log(err)
			}
		})
	}
	if len(types) != 8 {
		t.Errorf("sample covers %d event types, want all 8", len(types))
	}
	for _, file := range exampleFiles(t, "testdata/events/valid") {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			if err := sch.Validate(instance(t, data)); err != nil {
				t.Errorf("schema rejects a valid example: %v", err)
			}
			if _, err := schema.DecodeEvent(data); err != nil {
				t.Errorf("DecodeEvent rejects a valid example: %v", err)
			}
		})
	}
}

// Invalid event examples are named decode_error__*.json (DecodeEvent rejects
// them too) or schema_only__*.json (well-typed JSON that misses a required
// field or breaks a bound; DecodeEvent does not check those).
func TestEventSchemaRejectsInvalidExamples(t *testing.T) {
	sch := compileSchema(t, "event.schema.json", schema.EventSchemaID)
	for _, file := range exampleFiles(t, "testdata/events/invalid") {
		name := strings.TrimSuffix(filepath.Base(file), ".json")
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			if err := sch.Validate(instance(t, data)); err == nil {
				t.Errorf("schema accepts an invalid example")
			}
			_, decErr := schema.DecodeEvent(data)
			switch {
			case strings.HasPrefix(name, "decode_error__"):
				if decErr == nil {
					t.Errorf("DecodeEvent accepts it")
				}
			case strings.HasPrefix(name, "schema_only__"):
				if decErr != nil {
					t.Errorf("DecodeEvent rejects it (%v): rename it decode_error__", decErr)
				}
			default:
				t.Fatalf("example %s is not named decode_error__ or schema_only__", file)
			}
		})
	}
}

// TestEventSchemaNilSlices records why producers must send [] for rewind's id
// lists: a Go nil slice encodes as null, which the schema rejects.
func TestEventSchemaNilSlices(t *testing.T) {
	sch := compileSchema(t, "event.schema.json", schema.EventSchemaID)
	rw := sampleEvents()[4].(*schema.Rewind)
	rw.RemovedCondenseIDs = nil
	data, err := schema.Marshal(rw)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(data, []byte(`"removed_condense_ids":null`)) {
		t.Fatalf("nil slice did not encode as null: %s", data)
	}
	if sch.Validate(instance(t, data)) == nil {
		t.Errorf("schema accepts null removed_condense_ids")
	}
	back, err := schema.DecodeEvent(data)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, rw) {
		t.Errorf("round trip changed the event: %+v", back)
	}
}
