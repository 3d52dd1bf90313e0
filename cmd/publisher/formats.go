package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/sashabaranov/go-openai"

	"github.com/ctxpipe/ctxpipe/schema"
)

// Format is a transcript file's layout.
type Format string

// The transcript formats publish reads.
const (
	FormatAuto Format = "auto"
	// FormatTurns is JSON Lines of schema.Turn (ours; /work/shared/data/transcripts).
	FormatTurns Format = "turns"
	// FormatAnthropic is a Messages API array: [{"role","content":string|blocks}],
	// as coding agents store their API history; or {"system","messages":[…]}.
	FormatAnthropic Format = "anthropic"
	// FormatOpenAI is a Chat Completions messages array with tool_calls and
	// role "tool" replies; or {"messages":[…]}.
	FormatOpenAI Format = "openai"
)

// ParseFormat checks a --format value.
func ParseFormat(s string) (Format, error) {
	switch f := Format(s); f {
	case FormatAuto, FormatTurns, FormatAnthropic, FormatOpenAI:
		return f, nil
	}
	return "", fmt.Errorf("unknown format %q (want auto, turns, anthropic or openai)", s)
}

// Transcript is a file converted to turns. Turns may lack ids, a
// conversation and timestamps; Prepare fills them.
type Transcript struct {
	Format Format
	Turns  []schema.Turn
	// SystemPrompt is the system message of an Anthropic or OpenAI file.
	SystemPrompt string
	// Lines holds, for a turns file, the line each turn starts on, so that
	// an error names the line to fix.
	Lines []int
}

// where names turn i (from 0) for an error: its line when the file's
// format has them.
func (tr *Transcript) where(i int) string {
	if i < len(tr.Lines) {
		return fmt.Sprintf("line %d (turn %d)", tr.Lines[i], i+1)
	}
	return fmt.Sprintf("turn %d", i+1)
}

// apiMessage is the union of the fields we read from Anthropic and OpenAI
// messages; detection looks at which ones are present.
type apiMessage struct {
	Role             string            `json:"role"`
	Content          json.RawMessage   `json:"content"`
	ReasoningContent string            `json:"reasoning_content"` // DeepSeek and others
	ToolCalls        []openai.ToolCall `json:"tool_calls"`
	ToolCallID       string            `json:"tool_call_id"`
}

// wrapper is a whole request body: {"system"?, "messages":[…]}.
type wrapper struct {
	System   json.RawMessage `json:"system"`
	Messages json.RawMessage `json:"messages"`
}

// DetectFormat guesses a file's format from its content: an array (or an
// object holding "messages") is Anthropic or OpenAI, told apart by
// OpenAI-only fields and roles; anything else is JSON Lines of turns.
func DetectFormat(data []byte) (Format, error) {
	t := bytes.TrimLeft(data, " \t\r\n\ufeff")
	if len(t) == 0 {
		return "", errors.New("empty transcript")
	}
	var arr json.RawMessage
	switch t[0] {
	case '[':
		arr = t
	case '{':
		var w wrapper
		if err := json.Unmarshal(t, &w); err != nil || len(w.Messages) == 0 {
			// Not a single object with messages: several objects, one per line.
			return FormatTurns, nil
		}
		if len(w.System) > 0 {
			return FormatAnthropic, nil // only Anthropic has a top-level system
		}
		arr = w.Messages
	default:
		return "", errors.New("a transcript starts with [ or {")
	}
	var msgs []apiMessage
	if err := json.Unmarshal(arr, &msgs); err != nil {
		return "", fmt.Errorf("messages array: %w", err)
	}
	for _, m := range msgs {
		switch m.Role {
		case "system", "developer", "tool":
			return FormatOpenAI, nil
		}
		if len(m.ToolCalls) > 0 || m.ToolCallID != "" || m.ReasoningContent != "" {
			return FormatOpenAI, nil
		}
		if bytes.Contains(m.Content, []byte(`"image_url"`)) {
			return FormatOpenAI, nil
		}
	}
	return FormatAnthropic, nil
}

// ParseTranscript converts data in format f (FormatAuto detects it).
func ParseTranscript(data []byte, f Format) (Transcript, error) {
	if f == FormatAuto || f == "" {
		var err error
		if f, err = DetectFormat(data); err != nil {
			return Transcript{}, err
		}
	}
	var (
		tr  Transcript
		err error
	)
	switch f {
	case FormatTurns:
		tr, err = parseTurns(data)
	case FormatAnthropic, FormatOpenAI:
		tr, err = parseAPI(data, f)
	default:
		return Transcript{}, fmt.Errorf("unknown format %q", f)
	}
	if err != nil {
		return Transcript{}, fmt.Errorf("%s transcript: %w", f, err)
	}
	if len(tr.Turns) == 0 {
		return Transcript{}, fmt.Errorf("%s transcript: no turns", f)
	}
	tr.Format = f
	return tr, nil
}

func parseTurns(data []byte) (Transcript, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	var tr Transcript
	// lineAt is the line of byte offset off, counting from where the last
	// call stopped (offsets only grow).
	line, counted := 1, 0
	lineAt := func(off int) int {
		off = min(off, len(data))
		line += bytes.Count(data[counted:off], []byte("\n"))
		counted = off
		return line
	}
	for {
		// The next turn starts after the white space that follows the last.
		start := int(dec.InputOffset())
		for start < len(data) && strings.IndexByte(" \t\r\n", data[start]) >= 0 {
			start++
		}
		var t schema.Turn
		err := dec.Decode(&t)
		if errors.Is(err, io.EOF) {
			return tr, nil
		}
		if err != nil {
			at := start
			var se *json.SyntaxError
			if errors.As(err, &se) {
				at = int(se.Offset)
			}
			return tr, fmt.Errorf("line %d (turn %d): %w", lineAt(at), len(tr.Turns)+1, err)
		}
		tr.Turns = append(tr.Turns, t)
		tr.Lines = append(tr.Lines, lineAt(start))
	}
}

func parseAPI(data []byte, f Format) (Transcript, error) {
	var tr Transcript
	t := bytes.TrimLeft(data, " \t\r\n\ufeff")
	arr := json.RawMessage(t)
	if len(t) > 0 && t[0] == '{' {
		var w wrapper
		if err := json.Unmarshal(t, &w); err != nil {
			return tr, err
		}
		if len(w.Messages) == 0 {
			return tr, errors.New(`object has no "messages"`)
		}
		if len(w.System) > 0 {
			s, err := plainText(w.System)
			if err != nil {
				return tr, fmt.Errorf("system: %w", err)
			}
			tr.SystemPrompt = s
		}
		arr = w.Messages
	}
	var msgs []apiMessage
	if err := json.Unmarshal(arr, &msgs); err != nil {
		return tr, err
	}
	var system []string
	if tr.SystemPrompt != "" {
		system = append(system, tr.SystemPrompt)
	}
	for i, m := range msgs {
		var (
			role    schema.Role
			content schema.Content
			err     error
		)
		switch {
		case m.Role == "system" || m.Role == "developer":
			s, err := plainText(m.Content)
			if err != nil {
				return tr, fmt.Errorf("message %d (%s): %w", i+1, m.Role, err)
			}
			system = append(system, s)
			continue
		case f == FormatOpenAI:
			role, content, err = openAIMessage(m)
		default:
			role, content, err = anthropicMessage(m)
		}
		if err != nil {
			return tr, fmt.Errorf("message %d (%s): %w", i+1, m.Role, err)
		}
		tr.Turns = appendMerged(tr.Turns, role, content)
	}
	tr.SystemPrompt = strings.Join(system, "\n\n")
	return tr, nil
}

// appendMerged appends a turn, or merges it into the last one when the role
// repeats: tool results and a following user message become one user turn,
// as the Anthropic API wants roles to alternate.
func appendMerged(turns []schema.Turn, role schema.Role, c schema.Content) []schema.Turn {
	if n := len(turns); n > 0 && turns[n-1].Role == role {
		last := &turns[n-1]
		blocks := append(append([]schema.Block{}, last.Content.BlocksOf()...), c.BlocksOf()...)
		last.Content = schema.BlockContent(blocks...)
		return turns
	}
	return append(turns, schema.Turn{Role: role, Content: c})
}

// plainText reads a system prompt: a string, or text blocks / parts joined.
func plainText(raw json.RawMessage) (string, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("want a string or an array of text parts")
	}
	var texts []string
	for _, p := range parts {
		if p.Type == "text" || p.Type == "input_text" {
			texts = append(texts, p.Text)
		}
	}
	return strings.Join(texts, "\n"), nil
}

func anthropicMessage(m apiMessage) (schema.Role, schema.Content, error) {
	role := schema.Role(m.Role)
	if role != schema.RoleUser && role != schema.RoleAssistant {
		return "", schema.Content{}, fmt.Errorf("role must be user or assistant, got %q", m.Role)
	}
	raw := bytes.TrimLeft(m.Content, " \t\r\n")
	if len(raw) == 0 || raw[0] != '[' {
		var c schema.Content
		if len(raw) > 0 {
			if err := json.Unmarshal(raw, &c); err != nil {
				return "", c, err
			}
		}
		return role, c, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return "", schema.Content{}, err
	}
	blocks := make([]schema.Block, 0, len(items))
	for j, it := range items {
		var peek struct {
			Type     string `json:"type"`
			Thinking string `json:"thinking"`
		}
		if err := json.Unmarshal(it, &peek); err != nil {
			return "", schema.Content{}, fmt.Errorf("block %d: %w", j, err)
		}
		switch peek.Type {
		case "thinking":
			// Anthropic's extended thinking is our reasoning block; the
			// signature only matters to Anthropic's own API.
			blocks = append(blocks, schema.Block{Type: schema.BlockReasoning, Text: peek.Thinking})
			continue
		case "redacted_thinking":
			continue // encrypted: nothing to keep or count
		}
		var b schema.Block
		if err := json.Unmarshal(it, &b); err != nil {
			return "", schema.Content{}, fmt.Errorf("block %d: %w", j, err)
		}
		blocks = append(blocks, b)
	}
	return role, schema.BlockContent(blocks...), nil
}

func openAIMessage(m apiMessage) (schema.Role, schema.Content, error) {
	switch m.Role {
	case "user":
		c, err := openAIContent(m.Content)
		return schema.RoleUser, c, err
	case "tool":
		if m.ToolCallID == "" {
			return "", schema.Content{}, errors.New("a tool message needs tool_call_id")
		}
		c, err := openAIContent(m.Content)
		if err != nil {
			return "", c, err
		}
		return schema.RoleUser, schema.BlockContent(schema.Block{
			Type: schema.BlockToolResult, ToolUseID: m.ToolCallID, Content: &c,
		}), nil
	case "assistant":
		c, err := openAIContent(m.Content)
		if err != nil {
			return "", c, err
		}
		if m.ReasoningContent == "" && len(m.ToolCalls) == 0 {
			return schema.RoleAssistant, c, nil
		}
		var blocks []schema.Block
		if m.ReasoningContent != "" {
			blocks = append(blocks, schema.Block{Type: schema.BlockReasoning, Text: m.ReasoningContent})
		}
		blocks = append(blocks, c.BlocksOf()...)
		for _, tc := range m.ToolCalls {
			blocks = append(blocks, schema.Block{
				Type: schema.BlockToolUse, ID: tc.ID, Name: tc.Function.Name,
				Input: toolInput(tc.Function.Arguments),
			})
		}
		return schema.RoleAssistant, schema.BlockContent(blocks...), nil
	}
	return "", schema.Content{}, fmt.Errorf("unsupported role %q", m.Role)
}

// toolInput keeps the arguments string's own bytes as the tool input, so
// that the input is counted as the model wrote it. Arguments that are not
// JSON (a model's malformed call) are kept as a string field instead of
// failing the whole transcript.
func toolInput(args string) json.RawMessage {
	if strings.TrimSpace(args) == "" {
		return json.RawMessage(`{}`)
	}
	if json.Valid([]byte(args)) {
		return json.RawMessage(args)
	}
	b, _ := schema.Marshal(map[string]string{"arguments": args})
	return b
}

// openAIContent converts a string, null or an array of parts (text,
// image_url) to content.
func openAIContent(raw json.RawMessage) (schema.Content, error) {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	if len(raw) == 0 || raw[0] == 'n' {
		return schema.Content{}, nil
	}
	if raw[0] == '"' {
		var s string
		err := json.Unmarshal(raw, &s)
		return schema.TextContent(s), err
	}
	var parts []struct {
		Type     string `json:"type"`
		Text     string `json:"text"`
		ImageURL struct {
			URL string `json:"url"`
		} `json:"image_url"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return schema.Content{}, errors.New("content must be a string, null or an array of parts")
	}
	var blocks []schema.Block
	for _, p := range parts {
		switch p.Type {
		case "text", "input_text":
			blocks = append(blocks, schema.Block{Type: schema.BlockText, Text: p.Text})
		case "image_url":
			blocks = append(blocks, schema.Block{Type: schema.BlockImage, Source: imageSource(p.ImageURL.URL)})
		default:
			return schema.Content{}, fmt.Errorf("unsupported content part %q", p.Type)
		}
	}
	return schema.BlockContent(blocks...), nil
}

// imageSource turns a data: URL into a base64 source and anything else into
// a URL source.
func imageSource(u string) *schema.ImageSource {
	if rest, ok := strings.CutPrefix(u, "data:"); ok {
		if meta, data, ok := strings.Cut(rest, ","); ok && strings.HasSuffix(meta, ";base64") {
			return &schema.ImageSource{Type: "base64", MediaType: strings.TrimSuffix(meta, ";base64"), Data: data}
		}
	}
	return &schema.ImageSource{Type: "url", URL: u}
}
