package textfacts

import (
	"bytes"
	"encoding/json"
	"strings"
	"unicode/utf8"
)

// ToolInput is what the extraction reads of a tool call's input, decoded
// once for a reader's facts and the files list alike.
type ToolInput struct {
	// Paths are the strings under the path keys, in pathKeys order, as
	// given (ExplicitPath decides which are paths).
	Paths []string
	// Commands are the strings under the command keys, in commandKeys
	// order, each with the paths its words name.
	Commands []Command
}

// Command is one shell command of a tool input.
type Command struct {
	Key   int // index in commandKeys: the same Key, the same input key
	Text  string
	Paths []string // the words of Text that look like paths
}

// ReadToolInput reads the path and command strings of a tool call's input,
// and the paths each command names, as encoding/json would decode the
// input into a map: the common shapes through scanStringObject, the rest
// through encoding/json itself.
func ReadToolInput(raw []byte) ToolInput {
	var in ToolInput
	var strs func(key string) []string
	if ms, ok := scanStringObject(raw); ok {
		strs = func(key string) []string {
			// The last member of a name wins, as in encoding/json's map.
			for i := len(ms) - 1; i >= 0; i-- {
				if string(ms[i].key) == key {
					v := string(ms[i].val)
					if ms[i].escaped {
						v = unescapeJSON(ms[i].val)
					}
					return stringsOf(v)
				}
			}
			return nil
		}
	} else {
		var input map[string]any
		_ = json.Unmarshal(raw, &input) // not an object: nothing to read
		if len(input) == 0 {
			return in
		}
		strs = func(key string) []string { return stringsOf(input[key]) }
	}
	for _, k := range pathKeys {
		in.Paths = append(in.Paths, strs(k)...)
	}
	for i, k := range commandKeys {
		for _, cmd := range strs(k) {
			in.Commands = append(in.Commands, Command{Key: i, Text: cmd, Paths: pathsInCommand(cmd)})
		}
	}
	return in
}

// member is one "name": "value" of a tool input, as scanStringObject found
// it: both raw, between their quotes.
type member struct {
	key, val []byte
	escaped  bool // val holds backslash escapes
}

// scanStringObject reads raw when it has the common shape of a tool input,
// {"command": "…"}: a JSON object whose names hold no escapes and whose
// values are all strings of valid UTF-8 with no control character and no
// \u escape. ok is false for anything else (arrays, numbers, nested
// objects, \u, invalid JSON…), which the caller gives to encoding/json. On
// what it takes, the two agree exactly (a test and a fuzz target hold them
// equal). It spares the common input encoding/json's decode into a map of
// interfaces, the costliest step of the extraction (operations.md,
// section 7).
func scanStringObject(raw []byte) (ms []member, ok bool) {
	if !utf8.Valid(raw) {
		return nil, false // encoding/json replaces invalid bytes: leave it to it
	}
	i := skipJSONSpace(raw, 0)
	if i == len(raw) || raw[i] != '{' {
		return nil, false
	}
	i = skipJSONSpace(raw, i+1)
	if i < len(raw) && raw[i] == '}' {
		return nil, skipJSONSpace(raw, i+1) == len(raw)
	}
	for {
		key, escaped, end, ok := scanJSONString(raw, i)
		if !ok || escaped {
			return nil, false
		}
		if i = skipJSONSpace(raw, end); i == len(raw) || raw[i] != ':' {
			return nil, false
		}
		val, escaped, end, ok := scanJSONString(raw, skipJSONSpace(raw, i+1))
		if !ok {
			return nil, false
		}
		ms = append(ms, member{key: key, val: val, escaped: escaped})
		if i = skipJSONSpace(raw, end); i == len(raw) {
			return nil, false
		}
		switch raw[i] {
		case ',':
			i = skipJSONSpace(raw, i+1)
		case '}':
			return ms, skipJSONSpace(raw, i+1) == len(raw)
		default:
			return nil, false
		}
	}
}

// skipJSONSpace is the index of the first byte at or after i that is not
// JSON white space (which, unlike \s, has no form feed).
func skipJSONSpace(raw []byte, i int) int {
	for i < len(raw) && (raw[i] == ' ' || raw[i] == '\t' || raw[i] == '\n' || raw[i] == '\r') {
		i++
	}
	return i
}

// scanJSONString reads the string that opens at raw[i]: its bytes between
// the quotes, whether they hold escapes, and the index after the closing
// quote. ok is false when no string opens there, or when it holds a
// control character or an escape other than \" \\ \/ \b \f \n \r \t.
func scanJSONString(raw []byte, i int) (s []byte, escaped bool, end int, ok bool) {
	if i == len(raw) || raw[i] != '"' {
		return nil, false, 0, false
	}
	for j := i + 1; j < len(raw); j++ {
		switch c := raw[j]; {
		case c == '"':
			return raw[i+1 : j], escaped, j + 1, true
		case c < 0x20:
			return nil, false, 0, false
		case c == '\\':
			if j+1 == len(raw) || jsonEscapes[raw[j+1]] == 0 {
				return nil, false, 0, false
			}
			escaped = true
			j++
		}
	}
	return nil, false, 0, false
}

// jsonEscapes maps the byte after a backslash to the byte it stands for,
// for the escapes scanJSONString takes; 0 for the others.
var jsonEscapes = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

// unescapeJSON decodes a string scanJSONString took with escaped set,
// copying the runs between escapes whole.
func unescapeJSON(s []byte) string {
	var b strings.Builder
	b.Grow(len(s))
	for {
		i := bytes.IndexByte(s, '\\')
		if i < 0 {
			b.Write(s)
			return b.String()
		}
		b.Write(s[:i])
		b.WriteByte(jsonEscapes[s[i+1]])
		s = s[i+2:]
	}
}

// Keys of tool inputs that name files directly.
var pathKeys = []string{"path", "file_path", "filepath", "filename", "file_name", "file", "target_file",
	"notebook_path", "paths", "files", "dir", "directory", "dir_path"}

// Keys of tool inputs that hold a shell command.
var commandKeys = []string{"command", "cmd", "script"}

// stringsOf returns v as a list of strings: a string, or the strings in an array.
func stringsOf(v any) []string {
	switch t := v.(type) {
	case string:
		if strings.TrimSpace(t) != "" {
			return []string{t}
		}
	case []any:
		var out []string
		for _, e := range t {
			if s, ok := e.(string); ok && strings.TrimSpace(s) != "" {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}
