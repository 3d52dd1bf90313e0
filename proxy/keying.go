package proxy

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/ctxpipe/ctxpipe/schema"
)

// Key says which conversation a request belongs to: the session the client
// named (or one derived from what it sent), and the agent inside it. Parallel
// sub-agents of one session share the session and differ by agent, so each
// has a conversation of its own.
type Key struct {
	Session string
	Agent   string
	// Parent is the conversation of the agent that started this one, when
	// the client says so ("" otherwise).
	Parent string
	// Source names where the session came from (a header, a body field, or
	// "derived"), for logs and the X-Ctxpipe-Key-Source header.
	Source string
}

// Conversation is the conversation id of the key: the session itself for
// the main agent, the session and the agent joined by "__" for a
// sub-agent; an id that would exceed the wire contract's length is
// shortened with a hash, so that it stays a valid, distinct id.
func (k Key) Conversation() string {
	if k.Agent == "" || k.Agent == k.Session {
		return k.Session
	}
	return fitID(k.Session + "__" + k.Agent)
}

// keyFields are the request body's fields that name a session.
type keyFields struct {
	// MetadataUserID is Anthropic's metadata.user_id: Claude Code puts a
	// JSON string with its session_id there (older versions a string
	// ending in _session_<uuid>).
	MetadataUserID string
	// PromptCacheKey is the Responses and Chat Completions field that
	// Codex sets to its session.
	PromptCacheKey string
	// Fallback is what a request without any session identifies itself by:
	// its leading system text and its first user message, canonical.
	Fallback []byte
}

// requestKey reads the key from the headers and body fields, first what
// names a conversation explicitly, then the clients' own session headers,
// then body fields, and only without any of them a hash of the fallback.
// Every id a client sends must be a valid conversation id.
func requestKey(h http.Header, f keyFields) (Key, error) {
	pick := func(names ...string) (string, string) {
		for _, n := range names {
			if v := strings.TrimSpace(h.Get(n)); v != "" {
				return v, n
			}
		}
		return "", ""
	}
	var k Key
	if v, src := pick("X-Ctxpipe-Conversation"); v != "" {
		k = Key{Session: v, Source: src}
		k.Agent, _ = pick("X-Ctxpipe-Agent")
	} else if v, src := pick("X-Claude-Code-Session-Id"); v != "" {
		k = Key{Session: v, Source: src}
		k.Agent, _ = pick("X-Claude-Code-Agent-Id")
		if p, _ := pick("X-Claude-Code-Parent-Agent-Id"); p != "" {
			k.Parent = Key{Session: v, Agent: p}.Conversation()
		}
	} else if v, src := pick("Session-Id", "Session_id", "X-Session-Affinity", "X-Session-Id"); v != "" {
		k = Key{Session: v, Source: src}
		if p, _ := pick("X-Parent-Session-Id"); p != "" {
			k.Parent = p
		}
	} else if s := metadataSession(f.MetadataUserID); s != "" {
		k = Key{Session: s, Source: "metadata.user_id"}
		k.Agent, _ = pick("X-Claude-Code-Agent-Id")
	} else if f.PromptCacheKey != "" {
		k = Key{Session: f.PromptCacheKey, Source: "prompt_cache_key"}
	} else {
		sum := sha256.New()
		sum.Write([]byte(f.MetadataUserID))
		sum.Write([]byte{0})
		sum.Write(f.Fallback)
		return Key{Session: "p-" + hex.EncodeToString(sum.Sum(nil))[:32], Source: "derived"}, nil
	}
	for _, id := range []struct{ what, v string }{{"session", k.Session}, {"agent", k.Agent}, {"parent", k.Parent}} {
		if id.v != "" && !schema.ValidConversationID(id.v) {
			return Key{}, fmt.Errorf("the %s id %q from %s is not a valid conversation id (1-%d characters of A-Z a-z 0-9 _ -, not starting with _)",
				id.what, clip(id.v, 64), k.Source, schema.MaxConversationIDLen)
		}
	}
	return k, nil
}

// metadataSession finds the session in Anthropic's metadata.user_id as
// Claude Code writes it: a JSON object in the string with a session_id
// member, or the older form user_<hash>_account_<uuid>_session_<uuid>.
// Any other user id names a user, not a conversation: "".
func metadataSession(userID string) string {
	if strings.HasPrefix(strings.TrimSpace(userID), "{") {
		var v struct {
			SessionID string `json:"session_id"`
		}
		if json.Unmarshal([]byte(userID), &v) == nil {
			return v.SessionID
		}
		return ""
	}
	if i := strings.LastIndex(userID, "_session_"); i >= 0 {
		return userID[i+len("_session_"):]
	}
	return ""
}

// forkID is the id of the n-th conversation that continues conv after the
// client's history stopped extending the recorded one (n ≥ 1).
func forkID(conv string, n int) string { return fitID(fmt.Sprintf("%s-f%d", conv, n)) }

// fitID keeps id within the conversation id's length: a longer one keeps a
// readable head and ends in a hash of the whole.
func fitID(id string) string {
	if len(id) <= schema.MaxConversationIDLen {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return id[:schema.MaxConversationIDLen-33] + "-" + hex.EncodeToString(sum[:16])
}

// clip cuts s to at most n bytes on a character boundary, for messages.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !isRuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }
