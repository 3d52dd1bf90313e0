package condense

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/ctxpipe/ctxpipe/internal/openaitest"
	"github.com/ctxpipe/ctxpipe/prompts"
	"github.com/ctxpipe/ctxpipe/schema"
)

// sleepRecorder stands in for the backoff sleep: it records each wait and
// returns at once (or with ctx's error), so retry tests take no wall time.
type sleepRecorder struct {
	mu    sync.Mutex
	waits []time.Duration
}

func (s *sleepRecorder) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.waits = append(s.waits, d)
	s.mu.Unlock()
	return ctx.Err()
}

func (s *sleepRecorder) got() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.waits...)
}

// newTestOpenAI returns a summarizer with recorded sleeps.
func newTestOpenAI(cfg Config) (*OpenAI, *sleepRecorder) {
	o := NewOpenAI(cfg, nil)
	rec := &sleepRecorder{}
	o.sleep = rec.sleep
	return o, rec
}

func textMsg(role schema.Role, text string) schema.Message {
	return schema.Message{Turn: schema.Turn{Role: role, Content: schema.TextContent(text)}}
}

func simpleRequest(p schema.Profile) schema.SummaryRequest {
	return schema.SummaryRequest{
		ConversationID: "conv-1",
		Prompt:         prompts.Detailed,
		Profile:        p,
		Messages: []schema.Message{
			textMsg(schema.RoleUser, "Fix the failing test in parser.go"),
			textMsg(schema.RoleAssistant, "I changed the loop bound."),
			textMsg(schema.RoleUser, prompts.FinalInstruction),
		},
	}
}

func TestSummarizeSuccessAndCost(t *testing.T) {
	srv := openaitest.New(t)
	srv.Enqueue(openaitest.Reply{Text: "  the summary \n", PromptTokens: 1000, CompletionTokens: 200, Model: "gpt-served-2024"})
	o, _ := newTestOpenAI(Config{BaseURL: srv.URL(), Model: "gpt-asked"})
	p := schema.Profile{ID: "p", Prices: schema.Prices{InputPerMTok: 3, OutputPerMTok: 15}}

	sum, err := o.Summarize(context.Background(), simpleRequest(p))
	if err != nil {
		t.Fatal(err)
	}
	want := schema.Summary{Text: "the summary", Model: "gpt-served-2024", InputTokens: 1000, OutputTokens: 200, Cost: 0.006}
	if sum.Text != want.Text || sum.Model != want.Model || sum.InputTokens != want.InputTokens ||
		sum.OutputTokens != want.OutputTokens || math.Abs(sum.Cost-want.Cost) > 1e-12 {
		t.Errorf("summary = %+v, want %+v", sum, want)
	}
	if got := srv.Requests()[0].Chat.Model; got != "gpt-asked" {
		t.Errorf("requested model = %q", got)
	}
}

func TestSummarizeModelFallback(t *testing.T) {
	srv := openaitest.New(t)
	// A server that reports no model (some local servers omit it).
	srv.Enqueue(openaitest.Reply{RawBody: `{"id":"x","object":"chat.completion","created":1,"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`})
	o, _ := newTestOpenAI(Config{BaseURL: srv.URL(), Model: "llama3"})
	sum, err := o.Summarize(context.Background(), simpleRequest(schema.Profile{}))
	if err != nil {
		t.Fatal(err)
	}
	if sum.Model != "llama3" || sum.Cost != 0 {
		t.Errorf("summary = %+v, want the requested model and no cost", sum)
	}
}

// A reply naming a model of megabytes (a broken or hostile endpoint) is
// cut: the name goes into events, which must stay small enough to publish
// and to read back.
func TestSummarizeModelNameBounded(t *testing.T) {
	srv := openaitest.New(t)
	srv.Enqueue(openaitest.Reply{Text: "ok", Model: strings.Repeat("m", 1<<20)})
	o, _ := newTestOpenAI(Config{BaseURL: srv.URL(), Model: "llama3"})
	sum, err := o.Summarize(context.Background(), simpleRequest(schema.Profile{}))
	if err != nil {
		t.Fatal(err)
	}
	if len(sum.Model) > maxModelBytes || !strings.HasPrefix(sum.Model, "mmm") {
		t.Errorf("model name of %d bytes", len(sum.Model))
	}
}

func TestEndpointResolution(t *testing.T) {
	a := openaitest.New(t)
	b := openaitest.New(t)
	tests := []struct {
		name      string
		cfg       Config
		profile   schema.Profile
		wantModel string
		wantSrv   *openaitest.Server
	}{
		{"config only", Config{BaseURL: a.URL(), Model: "cfg-model"}, schema.Profile{}, "cfg-model", a},
		{"llm overrides config", Config{BaseURL: a.URL(), Model: "cfg-model"},
			schema.Profile{LLM: schema.LLMConfig{BaseURL: b.URL(), Model: "llm-model"}}, "llm-model", b},
		{"condense_llm model with llm base_url", Config{Model: "cfg-model"},
			schema.Profile{LLM: schema.LLMConfig{BaseURL: b.URL(), Model: "big"}, CondenseLLM: schema.LLMConfig{Model: "cheap"}}, "cheap", b},
		{"condense_llm base_url too", Config{},
			schema.Profile{LLM: schema.LLMConfig{BaseURL: a.URL(), Model: "big"}, CondenseLLM: schema.LLMConfig{BaseURL: b.URL(), Model: "cheap"}}, "cheap", b},
		{"llm model with config base_url", Config{BaseURL: a.URL()},
			schema.Profile{LLM: schema.LLMConfig{Model: "llm-model"}}, "llm-model", a},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			beforeA, beforeB := a.Count(), b.Count()
			o, _ := newTestOpenAI(tt.cfg)
			sum, err := o.Summarize(context.Background(), simpleRequest(tt.profile))
			if err != nil {
				t.Fatal(err)
			}
			if sum.Model != tt.wantModel {
				t.Errorf("model = %q, want %q", sum.Model, tt.wantModel)
			}
			other := b
			if tt.wantSrv == b {
				other = a
			}
			before := map[*openaitest.Server]int{a: beforeA, b: beforeB}
			if tt.wantSrv.Count() != before[tt.wantSrv]+1 || other.Count() != before[other] {
				t.Errorf("request went to the wrong server")
			}
			reqs := tt.wantSrv.Requests()
			if got := reqs[len(reqs)-1].Chat.Model; got != tt.wantModel {
				t.Errorf("server saw model %q", got)
			}
		})
	}
}

func TestRequestShape(t *testing.T) {
	srv := openaitest.New(t)
	o, _ := newTestOpenAI(Config{BaseURL: srv.URL(), Model: "m"})
	toolResult := schema.TextContent("line one\nline two")
	req := schema.SummaryRequest{
		Prompt: "  Condense this.  ",
		Messages: []schema.Message{
			textMsg(schema.RoleUser, "please fix x.py"),
			{Turn: schema.Turn{Role: schema.RoleAssistant, Content: schema.BlockContent(
				schema.Block{Type: schema.BlockReasoning, Text: "secret thoughts"},
				schema.Block{Type: schema.BlockText, Text: "Looking at the file."},
				schema.Block{Type: schema.BlockToolUse, ID: "call_1", Name: "bash", Input: json.RawMessage(`{"command":"cat x.py"}`)},
			)}},
			{Turn: schema.Turn{Role: schema.RoleUser, Content: schema.BlockContent(
				schema.Block{Type: schema.BlockToolResult, ToolUseID: "call_1", IsError: true, Content: &toolResult},
				schema.Block{Type: schema.BlockImage, Source: &schema.ImageSource{Type: "base64", MediaType: "image/png", Data: "AAAA"}},
			)}},
			{Turn: schema.Turn{Role: schema.RoleAssistant, Content: schema.BlockContent(
				schema.Block{Type: schema.BlockReasoning, Text: "only reasoning"},
			)}},
			textMsg(schema.RoleUser, prompts.FinalInstruction),
		},
	}
	if _, err := o.Summarize(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	got := srv.Requests()[0].Chat.Messages
	want := []openai.ChatCompletionMessage{
		{Role: "system", Content: "Condense this."},
		{Role: "user", Content: "please fix x.py"},
		{Role: "assistant", Content: "Looking at the file.\n\n[tool call bash, id call_1] {\"command\":\"cat x.py\"}"},
		{Role: "user", Content: "[tool result for call_1] [error]\nline one\nline two\n\n[image]"},
		{Role: "user", Content: prompts.FinalInstruction},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d messages, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if got[i].Role != want[i].Role || got[i].Content != want[i].Content {
			t.Errorf("message %d = %s %q, want %s %q", i, got[i].Role, got[i].Content, want[i].Role, want[i].Content)
		}
	}
	if srv.Requests()[0].Chat.Stream {
		t.Error("request asked for streaming")
	}
}

func TestRetries(t *testing.T) {
	tests := []struct {
		name        string
		replies     []openaitest.Reply
		maxAttempts int
		budget      time.Duration
		wantErr     error // nil: success
		wantStatus  int   // APIError status of the final error
		wantCount   int   // requests the server saw
		wantWaits   []time.Duration
		// checkWaits: waits must fall within exponential backoff bounds
		checkBackoff bool
	}{
		{name: "429 then success", replies: []openaitest.Reply{{Status: 429}, {Text: "ok"}},
			wantCount: 2, checkBackoff: true},
		{name: "retry-after seconds honoured", replies: []openaitest.Reply{{Status: 429, RetryAfter: "2"}, {Status: 503, RetryAfter: "0.25"}, {Text: "ok"}},
			wantCount: 3, wantWaits: []time.Duration{2 * time.Second, 250 * time.Millisecond}},
		{name: "retry-after beyond budget gives up", replies: []openaitest.Reply{{Status: 429, RetryAfter: "600"}},
			budget: time.Minute, wantErr: ErrRateLimited, wantStatus: 429, wantCount: 1, wantWaits: []time.Duration{}},
		{name: "500 until attempts run out", replies: []openaitest.Reply{{Status: 500}, {Status: 500}, {Status: 502}, {Text: "never"}},
			maxAttempts: 3, wantErr: ErrServer, wantStatus: 502, wantCount: 3, checkBackoff: true},
		{name: "400 not retried", replies: []openaitest.Reply{{Status: 400}, {Text: "never"}},
			wantErr: nil, wantStatus: 400, wantCount: 1, wantWaits: []time.Duration{}},
		{name: "404 not retried", replies: []openaitest.Reply{{Status: 404}},
			wantStatus: 404, wantCount: 1, wantWaits: []time.Duration{}},
		{name: "empty content", replies: []openaitest.Reply{{Text: "   "}, {Text: "never"}},
			wantErr: ErrEmptySummary, wantCount: 1, wantWaits: []time.Duration{}},
		{name: "malformed JSON body", replies: []openaitest.Reply{{RawBody: `{"id":"x","choices":[}`}, {Text: "never"}},
			wantErr: ErrBadResponse, wantCount: 1, wantWaits: []time.Duration{}},
		{name: "HTML instead of JSON", replies: []openaitest.Reply{{RawBody: `<html>hello</html>`}, {Text: "never"}},
			wantErr: ErrBadResponse, wantCount: 1, wantWaits: []time.Duration{}},
		{name: "no choices", replies: []openaitest.Reply{{RawBody: `{"id":"x","object":"chat.completion","choices":[]}`}},
			wantErr: ErrBadResponse, wantCount: 1, wantWaits: []time.Duration{}},
		{name: "truncated body is retried", replies: []openaitest.Reply{{RawBody: `{"id":"x","choices":[{"message":`}, {Text: "ok"}},
			wantCount: 2, checkBackoff: true},
		{name: "non-JSON 502 from a proxy is retried", replies: []openaitest.Reply{{Status: 502, RawBody: "<html>bad gateway</html>"}, {Text: "ok"}},
			wantCount: 2, checkBackoff: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := openaitest.New(t)
			srv.Enqueue(tt.replies...)
			o, rec := newTestOpenAI(Config{BaseURL: srv.URL(), Model: "m", MaxAttempts: tt.maxAttempts, RetryBudget: tt.budget})
			sum, err := o.Summarize(context.Background(), simpleRequest(schema.Profile{}))
			wantFail := tt.wantErr != nil || tt.wantStatus != 0
			if wantFail {
				if err == nil {
					t.Fatalf("want an error, got summary %+v", sum)
				}
				if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
					t.Errorf("err = %v, want %v", err, tt.wantErr)
				}
				var apiErr *APIError
				if tt.wantStatus != 0 && (!errors.As(err, &apiErr) || apiErr.StatusCode != tt.wantStatus) {
					t.Errorf("err = %v, want an APIError with status %d", err, tt.wantStatus)
				}
				if tt.wantStatus == 400 && Retryable(err) {
					t.Errorf("400 classified retryable")
				}
			} else if err != nil || sum.Text != "ok" {
				t.Fatalf("summary %+v, err %v", sum, err)
			}
			if srv.Count() != tt.wantCount {
				t.Errorf("server saw %d requests, want %d", srv.Count(), tt.wantCount)
			}
			waits := rec.got()
			if tt.wantWaits != nil {
				if len(waits) != len(tt.wantWaits) {
					t.Fatalf("waits = %v, want %v", waits, tt.wantWaits)
				}
				for i := range waits {
					if waits[i] != tt.wantWaits[i] {
						t.Errorf("wait %d = %v, want %v", i, waits[i], tt.wantWaits[i])
					}
				}
			}
			if tt.checkBackoff {
				if len(waits) != tt.wantCount-1 {
					t.Fatalf("waits = %v, want %d", waits, tt.wantCount-1)
				}
				for i, w := range waits {
					hi := DefaultBaseBackoff << i
					if w < hi/2 || w > hi {
						t.Errorf("wait %d = %v, want in [%v, %v]", i, w, hi/2, hi)
					}
				}
			}
		})
	}
}

func TestBackoffCapped(t *testing.T) {
	o := NewOpenAI(Config{BaseBackoff: time.Second, MaxBackoff: 5 * time.Second}, nil)
	for attempt := 1; attempt <= 10; attempt++ {
		d := o.backoff(attempt, ErrNetwork)
		if d > 5*time.Second || d < time.Second/2 {
			t.Errorf("attempt %d: backoff %v out of bounds", attempt, d)
		}
	}
}

func TestRetryAfterHTTPDate(t *testing.T) {
	h := http.Header{}
	h.Set("Retry-After", time.Now().Add(time.Hour).UTC().Format(http.TimeFormat))
	if d := retryAfter(h); d < 58*time.Minute || d > time.Hour {
		t.Errorf("retryAfter(date) = %v", d)
	}
	h.Set("Retry-After", "soon")
	if d := retryAfter(h); d != 0 {
		t.Errorf("retryAfter(garbage) = %v", d)
	}
}

func TestBearerToken(t *testing.T) {
	tests := []struct {
		name     string
		cfg      Config
		profile  schema.Profile
		wantAuth string
	}{
		{"key from config", Config{APIKey: "sk-cfg"}, schema.Profile{}, "Bearer sk-cfg"},
		{"no key for a local server", Config{}, schema.Profile{}, ""},
		{"profile names its key variable", Config{APIKey: "sk-cfg", Getenv: func(k string) string {
			return map[string]string{"CTXPIPE_LLM_KEY_TEAM": "sk-team"}[k]
		}}, schema.Profile{LLM: schema.LLMConfig{APIKeyEnv: "CTXPIPE_LLM_KEY_TEAM"}}, "Bearer sk-team"},
		{"condense_llm key variable wins", Config{Getenv: func(k string) string {
			return map[string]string{"CTXPIPE_LLM_KEY_TEAM": "sk-team", "CTXPIPE_LLM_KEY_CHEAP": "sk-cheap"}[k]
		}}, schema.Profile{LLM: schema.LLMConfig{APIKeyEnv: "CTXPIPE_LLM_KEY_TEAM"}, CondenseLLM: schema.LLMConfig{APIKeyEnv: "CTXPIPE_LLM_KEY_CHEAP"}}, "Bearer sk-cheap"},
		// A profile naming one of the service's other variables (one that
		// skipped Validate) sends no key, not that variable's value.
		{"no other variable is read", Config{APIKey: "sk-cfg", Getenv: func(k string) string {
			return map[string]string{"NATS_PASSWORD": "service-secret", "HOME": "/root"}[k]
		}}, schema.Profile{LLM: schema.LLMConfig{APIKeyEnv: "NATS_PASSWORD"}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := openaitest.New(t)
			cfg := tt.cfg
			cfg.BaseURL, cfg.Model = srv.URL(), "m"
			o, _ := newTestOpenAI(cfg)
			if _, err := o.Summarize(context.Background(), simpleRequest(tt.profile)); err != nil {
				t.Fatal(err)
			}
			h := srv.Requests()[0].Header
			if got := h.Get("Authorization"); got != tt.wantAuth {
				t.Errorf("Authorization = %q, want %q", got, tt.wantAuth)
			}
			if _, present := h["Authorization"]; present != (tt.wantAuth != "") {
				t.Errorf("Authorization header present = %v", present)
			}
		})
	}
}

func TestWrongKeyIsNotRetried(t *testing.T) {
	srv := openaitest.New(t, openaitest.WithAPIKey("sk-right"))
	o, _ := newTestOpenAI(Config{BaseURL: srv.URL(), Model: "m", APIKey: "sk-wrong"})
	_, err := o.Summarize(context.Background(), simpleRequest(schema.Profile{}))
	var apiErr *APIError
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusUnauthorized || srv.Count() != 1 {
		t.Errorf("err = %v, count %d", err, srv.Count())
	}
}

func TestCancelDuringRequest(t *testing.T) {
	srv := openaitest.New(t)
	arrived := make(chan struct{})
	var once sync.Once
	srv.SetHandler(func(openai.ChatCompletionRequest) openaitest.Reply {
		once.Do(func() { close(arrived) })
		return openaitest.Reply{Text: "too late", Delay: time.Minute}
	})
	o, _ := newTestOpenAI(Config{BaseURL: srv.URL(), Model: "m"})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-arrived; cancel() }()
	_, err := o.Summarize(ctx, simpleRequest(schema.Profile{}))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if srv.Count() != 1 {
		t.Errorf("count = %d: a cancelled summary must not retry", srv.Count())
	}
}

func TestCancelDuringBackoff(t *testing.T) {
	srv := openaitest.New(t)
	srv.SetHandler(func(openai.ChatCompletionRequest) openaitest.Reply {
		return openaitest.Reply{Status: 429, RetryAfter: "60"}
	})
	o := NewOpenAI(Config{BaseURL: srv.URL(), Model: "m", RetryBudget: time.Hour}, nil) // the real sleep
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := o.Summarize(ctx, simpleRequest(schema.Profile{}))
		done <- err
	}()
	for srv.Count() == 0 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestAlreadyCancelled(t *testing.T) {
	srv := openaitest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, s := range []Summarizer{NewOpenAI(Config{BaseURL: srv.URL(), Model: "m"}, nil), &Offline{}} {
		if _, err := s.Summarize(ctx, simpleRequest(schema.Profile{})); !errors.Is(err, context.Canceled) {
			t.Errorf("%T: err = %v", s, err)
		}
	}
	if srv.Count() != 0 {
		t.Errorf("count = %d", srv.Count())
	}
}

func TestAttemptTimeoutRetried(t *testing.T) {
	srv := openaitest.New(t)
	srv.SetHandler(func(openai.ChatCompletionRequest) openaitest.Reply {
		return openaitest.Reply{Text: "slow", Delay: time.Minute}
	})
	o, rec := newTestOpenAI(Config{BaseURL: srv.URL(), Model: "m", Timeout: 20 * time.Millisecond, MaxAttempts: 2})
	_, err := o.Summarize(context.Background(), simpleRequest(schema.Profile{}))
	if !errors.Is(err, ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want ErrTimeout only", err)
	}
	if srv.Count() != 2 || len(rec.got()) != 1 {
		t.Errorf("count %d waits %v", srv.Count(), rec.got())
	}
}

func TestNetworkErrorRetried(t *testing.T) {
	srv := openaitest.New(t)
	url := srv.URL()
	srv.Close() // nothing listens there any more
	o, rec := newTestOpenAI(Config{BaseURL: url, Model: "m", MaxAttempts: 3})
	_, err := o.Summarize(context.Background(), simpleRequest(schema.Profile{}))
	if !errors.Is(err, ErrNetwork) {
		t.Fatalf("err = %v, want ErrNetwork", err)
	}
	if len(rec.got()) != 2 {
		t.Errorf("waits = %v, want 2", rec.got())
	}
}

// A manual condense's instructions reach the model in its system prompt.
func TestInstructionsReachTheModel(t *testing.T) {
	srv := openaitest.New(t)
	o, _ := newTestOpenAI(Config{BaseURL: srv.URL(), Model: "m"})
	for _, in := range []string{"", "keep the failing test names"} {
		req := simpleRequest(schema.Profile{})
		req.Instructions = in
		if _, err := o.Summarize(context.Background(), req); err != nil {
			t.Fatal(err)
		}
		reqs := srv.Requests()
		sys := reqs[len(reqs)-1].Chat.Messages[0]
		if sys.Role != "system" || !strings.HasPrefix(sys.Content, prompts.Detailed) {
			t.Fatalf("system message %+v", sys)
		}
		if got := strings.Contains(sys.Content, prompts.RequestInstructions+"\n<instructions>\nkeep the failing test names\n</instructions>"); got != (in != "") {
			t.Errorf("instructions %q in the system prompt: %v\n%s", in, got, sys.Content)
		}
	}
}
