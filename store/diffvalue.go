package store

import (
	"bytes"
	"cmp"
	"encoding/hex"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// -1 for a type go-sqlite3 does not return for an expression column.
func storageRank(v any) int {
	switch v.(type) {
	case nil:
		return 0
	case int64, float64:
		return 1
	case string:
		return 2
	case []byte:
		return 3
	}
	return -1
}

// compareValues orders two values as SQLite's ORDER BY ... COLLATE BINARY
// does.
func compareValues(x, y any) int {
	if rx, ry := storageRank(x), storageRank(y); rx != ry {
		return cmp.Compare(rx, ry)
	}
	switch x := x.(type) {
	case int64:
		switch y := y.(type) {
		case int64:
			return cmp.Compare(x, y)
		case float64:
			return compareIntFloat(x, y)
		}
	case float64:
		switch y := y.(type) {
		case int64:
			return -compareIntFloat(y, x)
		case float64:
			return cmp.Compare(x, y)
		}
	case string:
		return strings.Compare(x, y.(string))
	case []byte:
		return bytes.Compare(x, y.([]byte))
	}
	return 0 // both NULL
}

// compareIntFloat compares an integer with a real exactly, as SQLite does:
// converting i to float64 would round integers above 2^53.
func compareIntFloat(i int64, f float64) int {
	switch {
	case f < math.MinInt64:
		return 1
	case f >= math.MaxInt64: // 2^63: MaxInt64 rounds up to it
		return -1
	}
	if t := int64(f); i != t {
		return cmp.Compare(i, t)
	}
	// i is f's integer part: f's fraction decides.
	return cmp.Compare(0, f-math.Trunc(f))
}

func compareKeys(x, y []any, keyIdx []int) int {
	for _, i := range keyIdx {
		if c := compareValues(x[i], y[i]); c != 0 {
			return c
		}
	}
	return 0
}

// sameValue reports whether two stored values are the same: same storage
// class, same bytes (same bits for a real, so a difference in the last bit
// shows; SQLite never stores a NaN).
func sameValue(x, y any) bool {
	switch x := x.(type) {
	case nil:
		return y == nil
	case int64:
		y, ok := y.(int64)
		return ok && x == y
	case float64:
		y, ok := y.(float64)
		return ok && math.Float64bits(x) == math.Float64bits(y)
	case string:
		y, ok := y.(string)
		return ok && x == y
	case []byte:
		y, ok := y.([]byte)
		return ok && bytes.Equal(x, y)
	}
	return false
}

// rowDiff names the columns in which two rows with the same key differ, or
// is "" when they do not. When only one column differs and both values are
// short, it shows them, so a one-bit difference in a real is visible.
func rowDiff(cols []string, x, y []any) string {
	var diff []int
	for i := range cols {
		if !sameValue(x[i], y[i]) {
			diff = append(diff, i)
		}
	}
	switch len(diff) {
	case 0:
		return ""
	case 1:
		i := diff[0]
		s := cols[i] + " differs"
		vx, okx := shortValue(x[i])
		vy, oky := shortValue(y[i])
		if okx && oky {
			s += fmt.Sprintf(" (a %s, b %s)", vx, vy)
		} else if typeName(x[i]) != typeName(y[i]) {
			s += fmt.Sprintf(" (a %s, b %s)", typeName(x[i]), typeName(y[i]))
		}
		return s
	}
	names := make([]string, len(diff))
	for i, d := range diff {
		names[i] = cols[d]
	}
	return strings.Join(names, ", ") + " differ"
}

func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case int64:
		return "integer"
	case float64:
		return "real"
	case string:
		return "text"
	case []byte:
		return "blob"
	}
	return fmt.Sprintf("%T", v)
}

// shortValue renders a number, NULL or short text for a sample; a real
// always shows as one (1.0, not 1) and exactly (shortest round trip).
func shortValue(v any) (string, bool) {
	switch v := v.(type) {
	case nil:
		return "NULL", true
	case int64:
		return strconv.FormatInt(v, 10), true
	case float64:
		s := strconv.FormatFloat(v, 'g', -1, 64)
		if !strings.ContainsAny(s, ".eIN") {
			s += ".0"
		}
		return s, true
	case string:
		if len(v) <= 40 {
			return strconv.Quote(v), true
		}
	}
	return "", false
}

// formatKey renders a row's key for a sample: its values joined by "/",
// text as is (ids and conversation keys), long values cut.
func formatKey(row []any, keyIdx []int) string {
	parts := make([]string, len(keyIdx))
	for i, k := range keyIdx {
		switch v := row[k].(type) {
		case string:
			parts[i] = cut(v, 80)
		case []byte:
			parts[i] = "x'" + cut(hex.EncodeToString(v), 80) + "'"
		default:
			parts[i], _ = shortValue(v)
		}
	}
	return strings.Join(parts, "/")
}

// cut shortens s to at most n bytes, on a rune boundary, marking the cut.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
