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
	"strings"
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
// "Tool: <name>\nArguments: <input JSON>". The input is the block's own bytes
// with insignificant whitespace removed, which is what JSON.stringify of the
// parsed input gives: keys keep their order and <>& stay unescaped.
func SerializeToolUse(b *schema.Block) string {
	var sb strings.Builder
	sb.WriteString("Tool: ")
	sb.WriteString(b.Name)
	if len(b.Input) > 0 {
		sb.WriteString("\nArguments: ")
		sb.Write(compactJSON(b.Input))
	}
	return sb.String()
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
	var sb strings.Builder
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
			sb.WriteString("[Unsupported content block: " + string(item.Type) + "]")
		}
	}
	return sb.String()
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
