package schema

import (
	"bytes"
	"encoding/json"
	"strings"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/google/uuid"
)

// InputKind is the last token of a ctx.in subject.
type InputKind string

// The inputs ctxpipe accepts on ctx.in.<conv>.<kind>.
const (
	KindTurn     InputKind = "turn"
	KindCondense InputKind = "condense"
	KindOverflow InputKind = "overflow"
	KindRewind   InputKind = "rewind"
	// KindPin pins or unpins a stored message: {"id","ts","message_id","pinned"}.
	KindPin InputKind = "pin"
)

// MaxInstructionsLen bounds a manual condense's instructions, in characters
// (Unicode code points, as JSON Schema's maxLength counts them).
const MaxInstructionsLen = 2000

// Trigger says why a condense ran.
type Trigger string

// Condense triggers.
const (
	TriggerAuto   Trigger = "auto"   // the threshold was crossed by a turn
	TriggerManual Trigger = "manual" // ctx.in.<conv>.condense (Roo's button, Gemini's /compress)
	TriggerForced Trigger = "forced" // ctx.in.<conv>.overflow: the provider said the window was exceeded
)

// Subject prefixes.
const (
	InputSubjectPrefix = "ctx.in."
	EventSubjectPrefix = "ctx.events."
	// ProgressSubjectPrefix starts the subjects on which the service
	// announces a condense the moment it starts, before it commits:
	// ctx.progress.<conv>.context_managing, core NATS, no stream. It is a
	// hint that may be lost; the record is the event on CTX_EVENTS.
	ProgressSubjectPrefix = "ctx.progress."
)

// MaxConversationIDLen bounds a conversation id (and any subject token
// ctxpipe builds from one).
const MaxConversationIDLen = 128

// InvalidConversationID is the conversation an input_rejected event is filed
// under when the input's own conversation id cannot be read (a bad subject),
// so that the event still has a valid subject. It starts with '_', which no
// client's conversation id may, so no real conversation can receive it.
const InvalidConversationID = "_invalid"

// ValidConversationID reports whether id may name a conversation: 1–128
// characters of [A-Za-z0-9_-], which makes it safe as a NATS subject token,
// not starting with '_'. Ids starting with '_' are reserved for the service
// (InvalidConversationID is one); an input, query or profile that names one
// is rejected with bad_conversation_id.
func ValidConversationID(id string) bool {
	return ValidSubjectToken(id) && id[0] != '_'
}

// ValidSubjectToken reports whether s is 1–128 characters of [A-Za-z0-9_-]:
// safe as one token of a subject ctxpipe builds, such as the conversation of
// ctx.events.<conv>.<type>. Unlike ValidConversationID it accepts the
// service's reserved ids, so it is the check for events the service makes,
// never for ids a client sends.
func ValidSubjectToken(s string) bool {
	if len(s) == 0 || len(s) > MaxConversationIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// convIDRule completes a bad_conversation_id message.
const convIDRule = "must be 1-128 characters of [A-Za-z0-9_-], not starting with _ (reserved for the service)"

// InputSubject is the subject an input of kind k for conversation conv is published on.
func InputSubject(conv string, k InputKind) string {
	return InputSubjectPrefix + conv + "." + string(k)
}

// Input is one decoded, validated input. Kind selects which fields are set.
type Input struct {
	Kind           InputKind
	ID             string
	ConversationID string
	TS             int64
	Turn           *Turn   // KindTurn
	Trigger        Trigger // KindCondense: manual
	IncludeTarget  bool    // KindRewind
	// Instructions are a manual condense's own instructions to the
	// summarizer ("keep the failing test names"), at most MaxInstructionsLen.
	Instructions string // KindCondense
	MessageID    string // KindPin: the stored message to pin or unpin
	Pinned       bool   // KindPin: pin (true) or unpin (false)
}

// control is the payload of condense, overflow and rewind inputs.
type control struct {
	ID             string  `json:"id"`
	ConversationID string  `json:"conversation_id,omitempty"`
	TS             int64   `json:"ts"`
	Trigger        Trigger `json:"trigger,omitempty"`
	IncludeTarget  bool    `json:"include_target,omitempty"`
	Instructions   string  `json:"instructions,omitempty"`
	MessageID      string  `json:"message_id,omitempty"`
	Pinned         *bool   `json:"pinned,omitempty"`
}

// ControlPayload encodes the payload of a condense, overflow, rewind or pin input.
func ControlPayload(in Input) ([]byte, error) {
	c := control{ID: in.ID, ConversationID: in.ConversationID, TS: in.TS,
		Trigger: in.Trigger, IncludeTarget: in.IncludeTarget, Instructions: in.Instructions, MessageID: in.MessageID}
	if in.Kind == KindPin {
		c.Pinned = &in.Pinned
	}
	return Marshal(c)
}

// Tenancy. A tenant is a NATS account of its own whose clients use the
// tenant-free subjects (ctx.in.<conv>.<kind>, ctx.q.history, ...); the
// server maps them into the service's account with the tenant as the token
// after the prefix (ctx.in.<tenant>.<conv>.<kind>, ctx.q.<tenant>.history).
// Inside the service a conversation is known by its key, "<tenant>.<conv>",
// so two tenants' conversations never meet; without a tenant (clients in the
// service's own account) the key is the conversation id itself.

// ValidTenant reports whether t may name a tenant: a subject token not
// starting with '_'.
func ValidTenant(t string) bool { return ValidConversationID(t) }

// ConversationKey is the service's key for conversation conv of tenant
// ("" for none).
func ConversationKey(tenant, conv string) string {
	if tenant == "" {
		return conv
	}
	return tenant + "." + conv
}

// SplitKey returns the tenant ("" for none) and the conversation id of a key.
func SplitKey(key string) (tenant, conv string) {
	if t, c, ok := strings.Cut(key, "."); ok {
		return t, c
	}
	return "", key
}

// ValidConversationKey reports whether key is a conversation key the service
// may store and build subjects from: a subject token (reserved ids
// included), optionally qualified by a valid tenant.
func ValidConversationKey(key string) bool {
	t, c := SplitKey(key)
	return (t == "" && !strings.Contains(key, ".") || ValidTenant(t)) && ValidSubjectToken(c)
}

// SubjectTenant returns the tenant of an input subject (ctx.in.<tenant>.
// <conv>.<kind>), or "" when it names none or an invalid one: rejections of
// unreadable inputs are filed under the tenant when it can be read.
func SubjectTenant(subject string) string {
	rest, ok := strings.CutPrefix(subject, InputSubjectPrefix)
	if !ok || strings.Count(rest, ".") != 2 {
		return ""
	}
	t, _, _ := strings.Cut(rest, ".")
	if !ValidTenant(t) {
		return ""
	}
	return t
}

// ParseSubject splits ctx.in.<conv>.<kind> or ctx.in.<tenant>.<conv>.<kind>;
// conv is the conversation key (see ConversationKey).
func ParseSubject(subject string) (conv string, kind InputKind, err error) {
	rest, ok := strings.CutPrefix(subject, InputSubjectPrefix)
	if !ok {
		return "", "", Errorf(ReasonBadSubject, "subject %q is not under %s", subject, InputSubjectPrefix)
	}
	tokens := strings.Split(rest, ".")
	var tenant, k string
	switch len(tokens) {
	case 2:
		conv, k = tokens[0], tokens[1]
	case 3:
		tenant, conv, k = tokens[0], tokens[1], tokens[2]
		if !ValidTenant(tenant) {
			return "", "", Errorf(ReasonBadSubject, "subject %q names no valid tenant", subject)
		}
	default:
		return "", "", Errorf(ReasonBadSubject, "subject %q is not ctx.in.<conv>.<kind>", subject)
	}
	if !ValidConversationID(conv) {
		return "", "", Errorf(ReasonBadConversationID, "conversation id %q %s", conv, convIDRule)
	}
	conv = ConversationKey(tenant, conv)
	switch kind = InputKind(k); kind {
	case KindTurn, KindCondense, KindOverflow, KindRewind, KindPin:
		return conv, kind, nil
	}
	return conv, "", Errorf(ReasonUnknownKind, "unknown input kind %q", k)
}

// PeekID returns the "id" field of a payload if it can be read, so that even a
// rejected input is recorded under its own id (and its rejection is
// idempotent: the same broken payload sent again is a duplicate, not a
// second rejection). It reads the top-level object as far as it is well
// formed, so an id before a syntax error, a NUL byte or a value nested past
// any bound is still found. As DecodeInput, it matches the name
// case-insensitively and a repeated name keeps its last value.
func PeekID(data []byte) string {
	dec := jsontext.NewDecoder(bytes.NewReader(data), jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))
	if tok, err := dec.ReadToken(); err != nil || tok.Kind() != '{' {
		return ""
	}
	id := ""
	for {
		name, err := dec.ReadToken()
		if err != nil || name.Kind() != '"' {
			return id // the object's end, or where it stops being JSON
		}
		if !strings.EqualFold(name.String(), "id") {
			if dec.SkipValue() != nil {
				return id
			}
			continue
		}
		v, err := dec.ReadToken()
		if err != nil {
			return id
		}
		id = ""
		if v.Kind() == '"' {
			id = v.String()
		} else if v.Kind() == '{' || v.Kind() == '[' {
			// Not an id; and the rest of it is not worth reading.
			return ""
		}
	}
}

// DecodeInput decodes and validates the payload received on subject. A
// non-nil error is an *Error whose Reason goes into input_rejected.
func DecodeInput(subject string, data []byte) (Input, error) {
	conv, kind, err := ParseSubject(subject)
	if err != nil {
		return Input{}, err
	}
	// Payloads name the conversation as their client knows it, without the
	// tenant the server put into the subject.
	_, bare := SplitKey(conv)
	// json.Unmarshal below validates the whole payload; checking it
	// separately first would scan every input twice.
	if t := bytes.TrimLeft(data, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return Input{}, Errorf(ReasonInvalidJSON, "payload must be a JSON object")
	}
	// Before any decoding: the nesting bound keeps json.Unmarshal linear
	// (Content re-decodes what is below it once per level), and the bytes
	// stored must be UTF-8 for every reader of the history.
	if err := checkEncoding(data, MaxPayloadDepth); err != nil {
		return Input{}, err
	}
	in := Input{Kind: kind, ConversationID: conv}
	if kind == KindTurn {
		var w struct {
			Turn
			Content turnContent `json:"content"`
		}
		if err := decodeJSON(data, &w); err != nil {
			if ReasonOf(err) != "" {
				return Input{}, err // a rule the content decoder enforces as it reads
			}
			return Input{}, Errorf(ReasonInvalidJSON, "turn: %v", cleanJSONError(err))
		}
		t := w.Turn
		t.Content = Content(w.Content)
		if err := t.Validate(); err != nil {
			return Input{}, err
		}
		compactInputs(t.Content.Blocks)
		if t.ConversationID != bare {
			return Input{}, Errorf(ReasonConversationMismatch, "turn names conversation %q but arrived on %q", t.ConversationID, subject)
		}
		t.ConversationID = conv
		if t.ContinuesFrom != "" {
			tenant, _ := SplitKey(conv)
			t.ContinuesFrom = ConversationKey(tenant, t.ContinuesFrom)
		}
		t.ID = CanonicalID(t.ID)
		in.ID, in.TS, in.Turn = t.ID, t.TS, &t
		return in, nil
	}
	var c control
	if err := decodeJSON(data, &c); err != nil {
		return Input{}, Errorf(ReasonInvalidJSON, "%s: %v", kind, cleanJSONError(err))
	}
	if err := validateID(c.ID); err != nil {
		return Input{}, err
	}
	if c.ConversationID != "" && c.ConversationID != bare {
		return Input{}, Errorf(ReasonConversationMismatch, "payload names conversation %q but arrived on %q", c.ConversationID, subject)
	}
	if c.TS <= 0 {
		return Input{}, Errorf(ReasonBadTS, "ts must be a positive Unix time in milliseconds")
	}
	in.ID, in.TS, in.IncludeTarget = CanonicalID(c.ID), c.TS, c.IncludeTarget
	if kind == KindCondense {
		switch c.Trigger {
		case "", TriggerManual:
			in.Trigger = TriggerManual
		default:
			return Input{}, Errorf(ReasonBadTrigger, "a condense input's trigger must be %q, got %q", TriggerManual, c.Trigger)
		}
	}
	if kind == KindOverflow {
		in.Trigger = TriggerForced
	}
	if c.Instructions != "" {
		if kind != KindCondense {
			return Input{}, Errorf(ReasonBadInstructions, "only a condense input may carry instructions")
		}
		if n := utf8.RuneCountInString(c.Instructions); n > MaxInstructionsLen {
			return Input{}, Errorf(ReasonBadInstructions, "instructions are %d characters; at most %d", n, MaxInstructionsLen)
		}
		in.Instructions = c.Instructions
	}
	if kind == KindPin {
		// Every stored message id is a UUID (turns are checked the same
		// way; summaries, markers and stand-ins get derived ones).
		if _, err := uuid.Parse(c.MessageID); err != nil || len(c.MessageID) != 36 {
			return Input{}, Errorf(ReasonUnknownTarget, "message_id %q is not a message id (a UUID)", c.MessageID)
		}
		if c.Pinned == nil {
			return Input{}, Errorf(ReasonInvalidJSON, "a pin input needs pinned: true or false")
		}
		in.MessageID, in.Pinned = CanonicalID(c.MessageID), *c.Pinned
	} else if c.MessageID != "" || c.Pinned != nil {
		return Input{}, Errorf(ReasonInvalidJSON, "message_id and pinned belong to pin inputs only")
	}
	return in, nil
}

// compactInputs removes insignificant whitespace from tool inputs once, at
// the edge: encoding/json compacts a RawMessage when it encodes it, so doing
// it here makes the stored bytes, the counted bytes and the bytes read back
// the same (key order and characters are kept; nothing is HTML-escaped).
func compactInputs(blocks []Block) {
	for i := range blocks {
		if len(blocks[i].Input) > 0 {
			blocks[i].Input = compactValid(blocks[i].Input)
		}
	}
}

// compactValid removes the whitespace outside strings from valid JSON, in
// place: the decoder has checked the bytes, and Input is the block's own
// copy of them. Compact input (what agents send) is only read.
func compactValid(b []byte) []byte {
	w, inStr := 0, false
	for r := 0; r < len(b); r++ {
		c := b[r]
		switch {
		case inStr:
			if c == '\\' && r+1 < len(b) {
				b[w] = c
				w++
				r++
				c = b[r]
			} else if c == '"' {
				inStr = false
			}
		case c == '"':
			inStr = true
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			continue
		}
		if w != r {
			b[w] = c
		}
		w++
	}
	return b[:w]
}

// CanonicalID is a UUID as the service keeps it: in lower case. A UUID is
// the same in either case (RFC 9562), and clients differ (Swift writes upper
// case, most others lower): the same input sent in both must be one input,
// and wait_for must find it either way.
func CanonicalID(id string) string { return strings.ToLower(id) }

func validateID(id string) error {
	if id == "" {
		return Errorf(ReasonMissingID, "id is required")
	}
	if _, err := uuid.Parse(id); err != nil || len(id) != 36 {
		return Errorf(ReasonBadID, "id %q is not a UUID", id)
	}
	return nil
}

// cleanJSONError drops encoding/json's Go type names from a message meant for
// the agent that sent the input.
func cleanJSONError(err error) string {
	var te *json.UnmarshalTypeError
	if e, ok := err.(*json.UnmarshalTypeError); ok {
		te = e
		return "field " + te.Field + " has the wrong type (" + te.Value + ")"
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}
