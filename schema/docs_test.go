package schema_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// The docs in docs/ are the authority for the wire contract and for
// operating the service, so they must keep up with the code: every code a
// client can receive or send, every limit and every metric of the service
// is named there. A new one without docs fails here. (The flags table is
// checked against `consumer -h` itself, both ways, by cmd/consumer's
// TestFlagsTableMatchesHelp: a regexp over the source missed a flag
// registered with fs.String.)

// codeTypes are the string types whose values travel on the wire; each
// value must appear in docs/protocol.md in backticks (`invalid_json`).
var codeTypes = map[string]bool{
	"Reason": true, "EventType": true, "QueryCode": true, "InputKind": true, "Trigger": true,
	"View": true, "Strategy": true, "CounterKind": true, "BlockType": true, "Role": true,
	"QueryVerb": true, "TagField": true,
}

// limitPrefixes select the exported constants of package schema that are
// limits or defaults; each must be named in docs/protocol.md.
var limitPrefixes = []string{"Max", "Min", "Default", "Inherit"}

func readDoc(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "docs", name))
	if err != nil {
		t.Fatalf("read docs/%s: %v", name, err)
	}
	return string(b)
}

// goFiles returns the non-test Go files of dir, relative to the schema package.
func goFiles(t *testing.T, dir string) []string {
	t.Helper()
	all, err := filepath.Glob(filepath.Join("..", dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range all {
		if !strings.HasSuffix(f, "_test.go") {
			out = append(out, f)
		}
	}
	if len(out) == 0 {
		t.Fatalf("no Go files in %s", dir)
	}
	return out
}

// constant is one exported constant found in the source.
type constant struct {
	name, typ, value string // value is the unquoted string, "" for other kinds
	pos              string
}

// constants lists the exported constants declared in files. typ is the
// declared type's name ("Reason" for both Reason and schema.Reason).
func constants(t *testing.T, files []string) []constant {
	t.Helper()
	fset := token.NewFileSet()
	var out []constant
	for _, file := range files {
		f, err := parser.ParseFile(fset, file, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				typ := ""
				switch x := vs.Type.(type) {
				case *ast.Ident:
					typ = x.Name
				case *ast.SelectorExpr:
					typ = x.Sel.Name
				}
				for i, n := range vs.Names {
					if !n.IsExported() {
						continue
					}
					c := constant{name: n.Name, typ: typ, pos: fset.Position(n.Pos()).String()}
					if i < len(vs.Values) {
						if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
							c.value, _ = strconv.Unquote(lit.Value)
						}
					}
					out = append(out, c)
				}
			}
		}
	}
	return out
}

// TestDocsProtocolCodes: every reason code, event type, query code, input
// kind, trigger, view, strategy, counter, block type, role, query verb and
// tag of package schema (and the query codes pipeline adds) is in
// docs/protocol.md.
func TestDocsProtocolCodes(t *testing.T) {
	doc := readDoc(t, "protocol.md")
	files := append(goFiles(t, "schema"), goFiles(t, "pipeline")...)
	seen := map[string]int{}
	for _, c := range constants(t, files) {
		if !codeTypes[c.typ] || c.value == "" {
			continue
		}
		seen[c.typ]++
		if !strings.Contains(doc, "`"+c.value+"`") {
			t.Errorf("docs/protocol.md does not mention %s %s = `%s` (%s): document it", c.typ, c.name, c.value, c.pos)
		}
	}
	// The parser must have found the codes, or this test checks nothing.
	for _, typ := range []string{"Reason", "EventType", "QueryCode", "InputKind"} {
		if seen[typ] == 0 {
			t.Errorf("found no constant of type %s", typ)
		}
	}
}

// TestDocsProtocolLimits: every exported limit and default of package
// schema is named in docs/protocol.md.
func TestDocsProtocolLimits(t *testing.T) {
	doc := readDoc(t, "protocol.md")
	n := 0
	for _, c := range constants(t, goFiles(t, "schema")) {
		limit := false
		for _, p := range limitPrefixes {
			limit = limit || strings.HasPrefix(c.name, p)
		}
		if !limit {
			continue
		}
		n++
		if !regexp.MustCompile(`\b` + c.name + `\b`).MatchString(doc) {
			t.Errorf("docs/protocol.md does not name the limit %s (%s): document it", c.name, c.pos)
		}
	}
	if n == 0 {
		t.Error("found no limit constants")
	}
}

// metricName matches a metric name in Go source.
var metricName = regexp.MustCompile(`"(ctxpipe_[a-z0-9_]+)"`)

// TestDocsOperationsMetrics: every metric the repository's code registers or
// counts is in docs/operations.md.
func TestDocsOperationsMetrics(t *testing.T) {
	doc := readDoc(t, "operations.md")
	found := map[string]string{}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "data", "testdata", "node_modules":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range metricName.FindAllStringSubmatch(string(b), -1) {
			found[m[1]] = path
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(found) == 0 {
		t.Fatal("found no metric names")
	}
	names := make([]string, 0, len(found))
	for n := range found {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if !strings.Contains(doc, "`"+n+"`") {
			t.Errorf("docs/operations.md does not list the metric `%s` (%s): add it to the metrics table", n, found[n])
		}
	}
}
