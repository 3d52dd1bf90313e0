// Package tokens counts the tokens of stored messages the way Roo Code does:
// o200k_base over each block's text, a fixed serialization for tool calls and
// results, a size estimate for images, and a fudge factor applied once to the
// sum. The exact BPE encoder lives in tokens/o200k; this package holds the
// counting rules, which are the same whichever text counter is plugged in.
package tokens

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/ctxpipe/ctxpipe/schema"
)

// TextCounter counts the tokens of one string.
type TextCounter interface {
	Count(text string) int
}

// Counter applies the message counting rules with a TextCounter and a fudge factor.
type Counter struct {
	Text  TextCounter
	Fudge float64 // applied once per count, rounded up; 1 means none
}

// ImageTokensWithoutData is the estimate for an image that has no inline data.
const ImageTokensWithoutData = 300

// MaxCount is the largest count this package returns: counts saturate there
// instead of wrapping. It is schema.MaxTokenCount, larger than any valid
// context window, so a message that reaches it still reads as too large;
// and the engine's sums of counts this size cannot overflow an int.
const MaxCount = schema.MaxTokenCount

// Content counts a message's content: the sum over its blocks, times the
// fudge factor, rounded up. A string counts as one text block.
func (c Counter) Content(content schema.Content) int {
	if !content.IsBlocks {
		return c.fudged(c.count(content.Text))
	}
	return c.fudged(c.blocks(content.Blocks))
}

// String counts a plain text (a system prompt) with the fudge factor.
func (c Counter) String(s string) int { return c.fudged(c.count(s)) }

// Blocks returns the raw (unfudged) sum over blocks.
func (c Counter) Blocks(blocks []schema.Block) int { return c.blocks(blocks) }

func (c Counter) fudged(n int) int {
	if n <= 0 {
		return 0
	}
	f := c.Fudge
	if !(f > 0) { // zero, negative or NaN: no factor
		f = 1
	}
	// The product is clamped while it is still a float (+Inf included):
	// converting a float beyond the int range to int gives MinInt64 on amd64.
	v := math.Ceil(float64(n) * f)
	if v >= MaxCount {
		return MaxCount
	}
	return int(v)
}

// add is a + b for counts in [0, MaxCount], saturating at MaxCount.
func add(a, b int) int { return min(a+b, MaxCount) }

func (c Counter) count(s string) int {
	if s == "" {
		return 0
	}
	return clamp(c.Text.Count(s))
}

// clamp puts a count from a TextCounter into [0, MaxCount].
func clamp(n int) int { return max(0, min(n, MaxCount)) }

func (c Counter) blocks(blocks []schema.Block) int {
	total := 0
	for i := range blocks {
		b := &blocks[i]
		switch b.Type {
		case schema.BlockText:
			total = add(total, c.count(b.Text))
		case schema.BlockImage:
			total = add(total, ImageTokens(b.Source))
		case schema.BlockToolUse:
			total = add(total, c.count(SerializeToolUse(b)))
		case schema.BlockToolResult:
			total = add(total, c.count(SerializeToolResult(b)))
		}
		// Reasoning blocks are not counted, as in Roo: providers that return
		// reasoning (DeepSeek) do not feed earlier reasoning back as input.
	}
	return total
}

// ImageTokens is ceil(sqrt(len(base64 data))), or 300 when there is no data.
func ImageTokens(src *schema.ImageSource) int {
	if src == nil || src.Data == "" {
		return ImageTokensWithoutData
	}
	return clamp(int(math.Ceil(math.Sqrt(float64(len(src.Data))))))
}

// SerializeToolUse renders a tool call as it is counted:
// "Tool: <name>\nArguments: <input JSON>". The input is counted as
// JSON.stringify of the parsed input writes it (stringifyJSON): keys keep
// their order, and a string says its characters rather than the escapes
// an agent may have sent them as (\u00e9 for é, \u003c for <).
func SerializeToolUse(b *schema.Block) string {
	var args []byte
	if len(b.Input) > 0 {
		args = stringifyJSON(b.Input)
	}
	// Sized up front: one allocation, however long the arguments.
	var sb strings.Builder
	sb.Grow(len("Tool: ") + len(b.Name) + len("\nArguments: ") + len(args))
	sb.WriteString("Tool: ")
	sb.WriteString(b.Name)
	if len(b.Input) > 0 {
		sb.WriteString("\nArguments: ")
		sb.Write(args)
	}
	return sb.String()
}

// stringifyJSON is what JavaScript's JSON.stringify(JSON.parse(raw)) gives
// for raw, for the counting: no whitespace outside strings, and strings
// escaped as JavaScript escapes them: only the quote, the backslash and the
// control characters (\b \f \n \r \t, else \u00xx), a lone surrogate as
// \udxxx, everything else as itself. Numbers and the order of keys stay as
// sent (JavaScript would write 1.0 as 1 and put integer-like keys first;
// agents rarely send either). Compact JSON without a backslash, the common
// case, is returned as it is; JSON that does not parse too.
func stringifyJSON(raw []byte) []byte {
	if isCompact(raw) && jsEscapesOnly(raw) {
		return raw
	}
	out := make([]byte, 0, len(raw))
	for i := 0; i < len(raw); {
		ch := raw[i]
		switch {
		case ch == '"':
			end, str, ok := unquote(raw, i)
			if !ok {
				return compactJSON(raw)
			}
			out = appendJSString(out, str)
			i = end
		case ch == ' ' || ch == '\n' || ch == '\t' || ch == '\r':
			i++
		default:
			out = append(out, ch)
			i++
		}
	}
	return out
}

// jsEscapesOnly reports whether every escape in raw is one JSON.stringify
// writes the same way (\" \\ \b \f \n \r \t): code in a tool's
// arguments is full of \n, and needs no copy.
func jsEscapesOnly(raw []byte) bool {
	for i := bytes.IndexByte(raw, '\\'); i >= 0; {
		if i+1 >= len(raw) || !strings.ContainsRune(`"\bfnrt`, rune(raw[i+1])) {
			return false
		}
		next := bytes.IndexByte(raw[i+2:], '\\')
		if next < 0 {
			return true
		}
		i += 2 + next
	}
	return true
}

// unquote decodes the JSON string starting at raw[start] (a quote) into
// UTF-16 code units, as JavaScript holds it, and returns the index after
// its closing quote.
func unquote(raw []byte, start int) (end int, units []uint16, ok bool) {
	for i := start + 1; i < len(raw); {
		ch := raw[i]
		switch {
		case ch == '"':
			return i + 1, units, true
		case ch == '\\':
			if i+1 >= len(raw) {
				return 0, nil, false
			}
			switch e := raw[i+1]; e {
			case '"', '\\', '/':
				units = append(units, uint16(e))
			case 'b':
				units = append(units, '\b')
			case 'f':
				units = append(units, '\f')
			case 'n':
				units = append(units, '\n')
			case 'r':
				units = append(units, '\r')
			case 't':
				units = append(units, '\t')
			case 'u':
				if i+6 > len(raw) {
					return 0, nil, false
				}
				v, err := strconv.ParseUint(string(raw[i+2:i+6]), 16, 16)
				if err != nil {
					return 0, nil, false
				}
				units = append(units, uint16(v))
				i += 4
			default:
				return 0, nil, false
			}
			i += 2
		default:
			r, size := utf8.DecodeRune(raw[i:])
			units = utf16.AppendRune(units, r)
			i += size
		}
	}
	return 0, nil, false
}

// appendJSString appends units as JSON.stringify writes a string.
func appendJSString(out []byte, units []uint16) []byte {
	const hex = "0123456789abcdef"
	out = append(out, '"')
	for i := 0; i < len(units); i++ {
		u := units[i]
		switch {
		case u == '"' || u == '\\':
			out = append(out, '\\', byte(u))
		case u == '\b':
			out = append(out, '\\', 'b')
		case u == '\f':
			out = append(out, '\\', 'f')
		case u == '\n':
			out = append(out, '\\', 'n')
		case u == '\r':
			out = append(out, '\\', 'r')
		case u == '\t':
			out = append(out, '\\', 't')
		case u < 0x20:
			out = append(out, '\\', 'u', '0', '0', hex[u>>4], hex[u&0xf])
		case utf16.IsSurrogate(rune(u)):
			if u < 0xdc00 && i+1 < len(units) && units[i+1] >= 0xdc00 && units[i+1] < 0xe000 {
				out = utf8.AppendRune(out, utf16.DecodeRune(rune(u), rune(units[i+1])))
				i++
				continue
			}
			out = append(out, '\\', 'u', hex[u>>12], hex[u>>8&0xf], hex[u>>4&0xf], hex[u&0xf])
		default:
			out = utf8.AppendRune(out, rune(u))
		}
	}
	return append(out, '"')
}

func compactJSON(raw json.RawMessage) []byte {
	if isCompact(raw) {
		return raw
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return raw
	}
	return buf.Bytes()
}

// isCompact reports whether raw has no whitespace outside strings, so the
// common case (agents send compact JSON) needs no copy.
func isCompact(raw []byte) bool {
	inStr, esc := false, false
	for _, ch := range raw {
		switch {
		case esc:
			esc = false
		case inStr && ch == '\\':
			esc = true
		case ch == '"':
			inStr = !inStr
		case !inStr && (ch == ' ' || ch == '\n' || ch == '\t' || ch == '\r'):
			return false
		}
	}
	return true
}

// SerializeToolResult renders a tool result as it is counted:
// "Tool Result (<id>)", then "[Error]" when is_error, then the text, or one
// line per item of block content.
func SerializeToolResult(b *schema.Block) string {
	// Sized up front: one allocation, however long the result.
	var sb strings.Builder
	sb.Grow(toolResultLen(b))
	sb.WriteString("Tool Result (")
	sb.WriteString(b.ToolUseID)
	sb.WriteString(")")
	if b.IsError {
		sb.WriteString("\n[Error]")
	}
	if b.Content == nil {
		return sb.String()
	}
	if !b.Content.IsBlocks {
		sb.WriteString("\n")
		sb.WriteString(b.Content.Text)
		return sb.String()
	}
	for _, item := range b.Content.Blocks {
		sb.WriteString("\n")
		switch item.Type {
		case schema.BlockText:
			sb.WriteString(item.Text)
		case schema.BlockImage:
			sb.WriteString("[Image content]")
		default:
			sb.WriteString("[Unsupported content block: ")
			sb.WriteString(string(item.Type))
			sb.WriteString("]")
		}
	}
	return sb.String()
}

// toolResultLen is the length of SerializeToolResult(b).
func toolResultLen(b *schema.Block) int {
	n := len("Tool Result (") + len(b.ToolUseID) + len(")")
	if b.IsError {
		n += len("\n[Error]")
	}
	if b.Content == nil {
		return n
	}
	if !b.Content.IsBlocks {
		return n + 1 + len(b.Content.Text)
	}
	for _, item := range b.Content.Blocks {
		n++
		switch item.Type {
		case schema.BlockText:
			n += len(item.Text)
		case schema.BlockImage:
			n += len("[Image content]")
		default:
			n += len("[Unsupported content block: ") + len(item.Type) + len("]")
		}
	}
	return n
}

// Chars is Gemini CLI's character heuristic: 0.25 tokens per ASCII
// character and 1.3 per other character, rounded up. It is cheap but off by
// tens of percent on code and CJK text; use it only where that is acceptable.
type Chars struct{}

// Count estimates the tokens of s.
func (Chars) Count(s string) int {
	ascii, other := 0, 0
	for i := 0; i < len(s); {
		if s[i] < utf8.RuneSelf {
			ascii++
			i++
			continue
		}
		_, size := utf8.DecodeRuneInString(s[i:])
		other++
		i += size
	}
	return int(min(math.Ceil(float64(ascii)*0.25+float64(other)*1.3), MaxCount))
}
