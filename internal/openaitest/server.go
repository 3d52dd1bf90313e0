// Package openaitest runs an in-process HTTP server that speaks the OpenAI
// chat completions wire format, so tests exercise a real client (go-openai)
// end to end instead of a mock.
//
// The server answers POST /v1/chat/completions (and /chat/completions, for
// clients whose base URL has no /v1). Every request is decoded and recorded
// for assertions. Replies come, in this order of precedence, from:
//
//  1. the queue filled by Enqueue (one reply per request, first in first out);
//  2. the function set by SetHandler;
//  3. a deterministic default: "Summary of N messages." (system message not
//     counted) plus the first line of the first user message, with usage
//     estimated from the request's size.
//
// A Reply can also script failures: an HTTP status with an OpenAI-style error
// body, a Retry-After header, a raw (for example malformed) body, or a delay.
// When the request asks for "stream": true the reply is sent as server-sent
// events in the same format the OpenAI API uses.
//
// Typical use:
//
//	srv := openaitest.New(t, openaitest.WithAPIKey("sk-test"))
//	srv.Enqueue(openaitest.Reply{Status: 429, RetryAfter: "0"}, openaitest.Reply{Text: "done"})
//	client := openai.NewClientWithConfig(func() openai.ClientConfig {
//		c := openai.DefaultConfig("sk-test")
//		c.BaseURL = srv.URL()
//		return c
//	}())
package openaitest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"
)

// Reply scripts one answer of the server. A zero Reply is a 200 whose
// message content is empty; leave the queue empty for generated text.
type Reply struct {
	// Text is the assistant message content. Empty with Status 0/200 and no
	// RawBody means a successful response whose content is the empty string
	// (useful to test "empty summary" handling); use the default reply (an
	// empty queue and no handler) to get generated text.
	Text string
	// PromptTokens and CompletionTokens are reported in usage. Zero means
	// "estimate from the request and the text".
	PromptTokens     int
	CompletionTokens int
	// Model is the model the response reports; empty reports the requested one.
	Model string
	// FinishReason defaults to "stop".
	FinishReason string
	// Status is the HTTP status; 0 means 200. A status of 400 or more gets an
	// OpenAI-style error body unless RawBody is set.
	Status int
	// RetryAfter, when not empty, is sent as the Retry-After header
	// (seconds, or an HTTP date).
	RetryAfter string
	// RawBody, when not empty, is sent as the body verbatim (content type
	// application/json), replacing whatever the server would have written.
	RawBody string
	// Delay is waited before answering; the wait ends early when the client
	// gives up on the request.
	Delay time.Duration
}

// Request is one recorded request.
type Request struct {
	Method string
	Path   string
	Header http.Header
	// Body is the raw request body.
	Body []byte
	// Chat is Body decoded; the zero value when it was not valid JSON.
	Chat openai.ChatCompletionRequest
}

// Option configures a Server.
type Option func(*Server)

// WithAPIKey makes the server require "Authorization: Bearer <key>" and
// answer 401 (with an OpenAI-style error) otherwise. Rejected requests are
// still recorded.
func WithAPIKey(key string) Option { return func(s *Server) { s.apiKey = key } }

// defaultModel is the model reported when neither the Reply nor the
// request names one.
const defaultModel = "openaitest-model"

// Server is the fake OpenAI endpoint. It is safe for concurrent use.
type Server struct {
	srv    *httptest.Server
	apiKey string

	mu       sync.Mutex
	queue    []Reply
	handler  func(openai.ChatCompletionRequest) Reply
	requests []Request
	seq      int
}

// New starts a server and closes it when the test ends.
func New(t testing.TB, opts ...Option) *Server {
	t.Helper()
	s := &Server{}
	for _, o := range opts {
		o(s)
	}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serveHTTP))
	t.Cleanup(s.Close)
	return s
}

// URL is the base URL to give a client: it ends in /v1, as OpenAI's does.
func (s *Server) URL() string { return s.srv.URL + "/v1" }

// RootURL is the server's address without /v1, for clients that are
// configured with a bare host (the server accepts /chat/completions too).
func (s *Server) RootURL() string { return s.srv.URL }

// Close stops the server. It is safe to call more than once.
func (s *Server) Close() { s.srv.Close() }

// Enqueue appends scripted replies; each request takes the next one.
func (s *Server) Enqueue(r ...Reply) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queue = append(s.queue, r...)
}

// SetHandler sets the function that answers requests when the queue is
// empty. nil restores the default reply.
func (s *Server) SetHandler(f func(req openai.ChatCompletionRequest) Reply) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.handler = f
}

// Requests returns a copy of every request received so far, in arrival order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Count is the number of requests received so far.
func (s *Server) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.requests)
}

// Pending is the number of queued replies not yet served.
func (s *Server) Pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queue)
}

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "cannot read body: "+err.Error())
		return
	}
	rec := Request{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Body: body}
	decodeErr := json.Unmarshal(body, &rec.Chat)

	s.mu.Lock()
	s.requests = append(s.requests, rec)
	s.seq++
	seq := s.seq
	s.mu.Unlock()

	if r.URL.Path != "/v1/chat/completions" && r.URL.Path != "/chat/completions" {
		writeError(w, http.StatusNotFound, "invalid_request_error", "unknown path "+r.URL.Path)
		return
	}
	if r.Method != http.MethodPost {
		writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "use POST")
		return
	}
	if s.apiKey != "" && r.Header.Get("Authorization") != "Bearer "+s.apiKey {
		writeError(w, http.StatusUnauthorized, "invalid_request_error", "incorrect API key provided")
		return
	}
	if decodeErr != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "request body is not valid JSON: "+decodeErr.Error())
		return
	}

	reply := s.next(rec.Chat)
	if reply.Delay > 0 {
		t := time.NewTimer(reply.Delay)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}
	if reply.RetryAfter != "" {
		w.Header().Set("Retry-After", reply.RetryAfter)
	}
	status := reply.Status
	if status == 0 {
		status = http.StatusOK
	}
	if reply.RawBody != "" {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, reply.RawBody)
		return
	}
	if status >= http.StatusBadRequest {
		writeError(w, status, errorType(status), fmt.Sprintf("scripted failure with status %d", status))
		return
	}

	model := reply.Model
	if model == "" {
		model = rec.Chat.Model
	}
	if model == "" {
		model = defaultModel
	}
	usage := wireUsage{PromptTokens: reply.PromptTokens, CompletionTokens: reply.CompletionTokens}
	if usage.PromptTokens == 0 {
		usage.PromptTokens = estimatePrompt(rec.Chat)
	}
	if usage.CompletionTokens == 0 {
		usage.CompletionTokens = estimateTokens(reply.Text)
	}
	usage.TotalTokens = usage.PromptTokens + usage.CompletionTokens
	finish := reply.FinishReason
	if finish == "" {
		finish = "stop"
	}
	id := fmt.Sprintf("chatcmpl-openaitest-%d", seq)
	created := time.Now().Unix()

	if rec.Chat.Stream {
		includeUsage := rec.Chat.StreamOptions != nil && rec.Chat.StreamOptions.IncludeUsage
		writeStream(w, id, created, model, reply.Text, finish, usage, includeUsage)
		return
	}
	writeJSON(w, status, wireResponse{
		ID: id, Object: "chat.completion", Created: created, Model: model,
		Choices: []wireChoice{{
			Index:        0,
			Message:      &wireMessage{Role: "assistant", Content: reply.Text},
			FinishReason: finish,
		}},
		Usage: &usage,
	})
}

// next picks the reply for a request: queue, then handler, then default.
func (s *Server) next(req openai.ChatCompletionRequest) Reply {
	s.mu.Lock()
	if len(s.queue) > 0 {
		r := s.queue[0]
		s.queue = s.queue[1:]
		s.mu.Unlock()
		return r
	}
	h := s.handler
	s.mu.Unlock()
	if h != nil {
		return h(req)
	}
	return DefaultReply(req)
}

// DefaultReply is what the server answers when nothing is scripted: a short
// summary that names how many non-system messages it was given and quotes the
// first line of the first user message (at most 80 characters), so end-to-end
// tests can see which request produced it.
func DefaultReply(req openai.ChatCompletionRequest) Reply {
	n := 0
	first := ""
	for _, m := range req.Messages {
		if m.Role == openai.ChatMessageRoleSystem {
			continue
		}
		n++
		if m.Role == openai.ChatMessageRoleUser && first == "" {
			first = m.Content
		}
	}
	text := fmt.Sprintf("Summary of %d messages.", n)
	if excerpt := firstLine(first, 80); excerpt != "" {
		text += " First request: " + excerpt
	}
	return Reply{Text: text}
}

func firstLine(s string, limit int) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	r := []rune(s)
	if len(r) > limit {
		return string(r[:limit]) + "…"
	}
	return s
}

// estimateTokens approximates a token count as one per four bytes, at least
// one for non-empty text, the usual rule of thumb for English and code.
func estimateTokens(s string) int {
	if s == "" {
		return 0
	}
	return (len(s) + 3) / 4
}

func estimatePrompt(req openai.ChatCompletionRequest) int {
	n := 0
	for _, m := range req.Messages {
		n += 4 + estimateTokens(m.Content) // per-message framing, as OpenAI counts it
	}
	return n + 3
}

func errorType(status int) string {
	switch {
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status >= 500:
		return "server_error"
	case status == http.StatusUnauthorized:
		return "authentication_error"
	}
	return "invalid_request_error"
}

// Wire types, written out here rather than borrowed from go-openai so the
// server's output is checked against the client's decoding, not produced by it.
type wireResponse struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []wireChoice `json:"choices"`
	Usage   *wireUsage   `json:"usage,omitempty"`
}

type wireChoice struct {
	Index        int          `json:"index"`
	Message      *wireMessage `json:"message,omitempty"`
	Delta        *wireMessage `json:"delta,omitempty"`
	FinishReason any          `json:"finish_reason"` // string, or null while streaming
}

type wireMessage struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content"`
}

type wireUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

type wireError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(v); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

func writeError(w http.ResponseWriter, status int, typ, msg string) {
	var e wireError
	e.Error.Message = msg
	e.Error.Type = typ
	writeJSON(w, status, e)
}

// writeStream sends the reply as chat.completion.chunk events: a role chunk,
// one chunk per word, a final chunk with the finish reason, an optional usage
// chunk, then [DONE].
func writeStream(w http.ResponseWriter, id string, created int64, model, text, finish string, usage wireUsage, includeUsage bool) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	send := func(v any) {
		b, _ := json.Marshal(v)
		_, _ = fmt.Fprintf(w, "data: %s\n\n", b)
		if flusher != nil {
			flusher.Flush()
		}
	}
	chunk := func(delta *wireMessage, finish any) wireResponse {
		return wireResponse{ID: id, Object: "chat.completion.chunk", Created: created, Model: model,
			Choices: []wireChoice{{Index: 0, Delta: delta, FinishReason: finish}}}
	}
	send(chunk(&wireMessage{Role: "assistant", Content: ""}, nil))
	for _, piece := range splitKeep(text) {
		send(chunk(&wireMessage{Content: piece}, nil))
	}
	send(chunk(&wireMessage{}, finish))
	if includeUsage {
		u := usage
		send(wireResponse{ID: id, Object: "chat.completion.chunk", Created: created, Model: model,
			Choices: []wireChoice{}, Usage: &u})
	}
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
	if flusher != nil {
		flusher.Flush()
	}
}

// splitKeep splits text after each space so the pieces concatenate back to
// the exact text.
func splitKeep(text string) []string {
	var out []string
	for text != "" {
		i := strings.IndexByte(text, ' ')
		if i < 0 {
			out = append(out, text)
			break
		}
		out = append(out, text[:i+1])
		text = text[i+1:]
	}
	return out
}
