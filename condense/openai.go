package condense

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/ctxpipe/ctxpipe/internal/backoff"
	"github.com/ctxpipe/ctxpipe/prompts"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/textfacts"
)

// Summarizer is what the engine calls to condense a conversation. It has
// the same method set as engine.Summarizer, which is declared by its user;
// it is repeated here only so Router.Pick can name its result.
type Summarizer interface {
	Summarize(ctx context.Context, req schema.SummaryRequest) (schema.Summary, error)
}

// OpenAI summarizes through any OpenAI-compatible chat completions endpoint
// (OpenAI, Ollama, vLLM, llama.cpp server, LiteLLM) with one non-streaming
// request, retried on transient failures. It is safe for concurrent use.
type OpenAI struct {
	cfg  Config
	log  *slog.Logger
	http *http.Client
	// sleep waits between attempts; tests replace it to record the waits
	// instead of spending them.
	sleep func(ctx context.Context, d time.Duration) error
	now   func() time.Time
}

// NewOpenAI returns a summarizer using cfg's defaults; log may be nil.
func NewOpenAI(cfg Config, log *slog.Logger) *OpenAI {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	hc := cfg.HTTPClient
	if hc == nil {
		hc = &http.Client{}
	}
	return &OpenAI{cfg: cfg, log: log, http: hc, sleep: backoff.Sleep, now: time.Now}
}

// Summarize sends req to the profile's endpoint (see Config.Endpoint) and
// returns the reply's text with its usage and cost. Transient failures (429,
// 5xx, network errors, attempt timeouts) are retried with exponential backoff
// and jitter, or after the server's Retry-After, within Config.MaxAttempts
// and Config.RetryBudget. When ctx ends, Summarize returns promptly with an
// error wrapping ctx.Err().
func (o *OpenAI) Summarize(ctx context.Context, req schema.SummaryRequest) (schema.Summary, error) {
	if err := ctx.Err(); err != nil {
		return schema.Summary{}, fmt.Errorf("summarize: %w", err)
	}
	ep := o.cfg.Endpoint(req.Profile)
	ccfg := openai.DefaultConfig(ep.APIKey)
	ccfg.BaseURL = strings.TrimRight(ep.BaseURL, "/")
	ccfg.HTTPClient = o.http
	client := openai.NewClientWithConfig(ccfg)
	chat := openai.ChatCompletionRequest{Model: ep.Model, Messages: chatMessages(req)}

	log := o.log.With("conv", req.ConversationID, "model", ep.Model, "base_url", ep.BaseURL)
	start := o.now()
	maxAttempts, budget := o.cfg.maxAttempts(), o.cfg.retryBudget()
	for attempt := 1; ; attempt++ {
		sum, err := o.attempt(ctx, client, ep, chat, req.Profile.Prices)
		if err == nil {
			// The model's summary may drop paths; the list may not.
			sum.Text = textfacts.WithFilesTouched(sum.Text, source(req))
			return sum, nil
		}
		if ctx.Err() != nil {
			return schema.Summary{}, fmt.Errorf("summarize: %w", ctx.Err())
		}
		if !Retryable(err) {
			// sum carries the cost of an empty reply: it was paid for.
			return sum, fmt.Errorf("summarize with %s at %s: %w", ep.Model, ep.BaseURL, err)
		}
		if attempt >= maxAttempts {
			return schema.Summary{}, fmt.Errorf("summarize with %s at %s: gave up after %d attempts: %w", ep.Model, ep.BaseURL, attempt, err)
		}
		wait := o.backoff(attempt, err)
		if elapsed := o.now().Sub(start); elapsed+wait > budget {
			return schema.Summary{}, fmt.Errorf("summarize with %s at %s: retry budget %s spent after %d attempts: %w", ep.Model, ep.BaseURL, budget, attempt, err)
		}
		log.Warn("summarize attempt failed; retrying", "attempt", attempt, "wait", wait, "err", err)
		if err := o.sleep(ctx, wait); err != nil {
			return schema.Summary{}, fmt.Errorf("summarize: %w", err)
		}
	}
}

// attempt makes one request under its own timeout and classifies a failure.
func (o *OpenAI) attempt(ctx context.Context, client *openai.Client, ep Endpoint, chat openai.ChatCompletionRequest, prices schema.Prices) (schema.Summary, error) {
	actx, cancel := context.WithTimeout(ctx, ep.Timeout)
	defer cancel()
	resp, err := client.CreateChatCompletion(actx, chat)
	if err != nil {
		if ctx.Err() == nil && actx.Err() != nil {
			return schema.Summary{}, fmt.Errorf("%w after %s", ErrTimeout, ep.Timeout)
		}
		// go-openai records the response headers before it looks at the
		// status, so Retry-After is readable on failures too.
		return schema.Summary{}, classify(err, resp.Header())
	}
	if len(resp.Choices) == 0 {
		return schema.Summary{}, fmt.Errorf("%w: no choices in the reply", ErrBadResponse)
	}
	// The provider names its model: a broken or hostile endpoint could name
	// one of megabytes, and it goes into the condense events.
	model := schema.Clip(resp.Model, maxModelBytes)
	if model == "" {
		model = chat.Model
	}
	in, out := resp.Usage.PromptTokens, resp.Usage.CompletionTokens
	sum := schema.Summary{
		Text: strings.TrimSpace(resp.Choices[0].Message.Content), Model: model, InputTokens: in, OutputTokens: out,
		Cost: prices.Cost(in, out),
	}
	if sum.Text == "" {
		// Not retried: the same request tends to get the same reply (a
		// reasoning model that spent its budget thinking). The engine
		// reports empty_summary, with what the reply cost.
		return sum, fmt.Errorf("%w: %w", ErrEmptySummary,
			schema.Errorf(schema.ReasonEmptySummary, "the model returned no text (finish reason %q)", resp.Choices[0].FinishReason))
	}
	return sum, nil
}

// maxModelBytes bounds the model name a reply reports.
const maxModelBytes = 256

// classify maps a go-openai error onto our error classes.
func classify(err error, h http.Header) error {
	var apiErr *openai.APIError
	if errors.As(err, &apiErr) {
		return &APIError{StatusCode: apiErr.HTTPStatusCode, Message: apiErr.Message, RetryAfter: retryAfter(h), Err: err}
	}
	var reqErr *openai.RequestError
	if errors.As(err, &reqErr) {
		msg := http.StatusText(reqErr.HTTPStatusCode)
		if body := strings.TrimSpace(string(reqErr.Body)); body != "" {
			msg = textfacts.Clip(body, 200)
		}
		return &APIError{StatusCode: reqErr.HTTPStatusCode, Message: msg, RetryAfter: retryAfter(h), Err: err}
	}
	// A body cut off midway (unexpected EOF) is counted as a network failure:
	// a proxy or a dropped connection does that, and another try may succeed.
	var netErr net.Error
	if errors.As(err, &netErr) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: %w", ErrNetwork, err)
	}
	var syntaxErr *json.SyntaxError
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &syntaxErr) || errors.As(err, &typeErr) {
		return fmt.Errorf("%w: %w", ErrBadResponse, err)
	}
	// Anything else (a request the client refused to build, an unexpected
	// decoding failure) would fail the same way again.
	return fmt.Errorf("%w: %w", ErrBadResponse, err)
}

// retryAfter parses a Retry-After header: delay seconds or an HTTP date.
func retryAfter(h http.Header) time.Duration {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseFloat(v, 64); err == nil {
		if secs <= 0 {
			return 0
		}
		return time.Duration(secs * float64(time.Second))
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := time.Until(t); d > 0 {
			return d
		}
	}
	return 0
}

// backoff is the wait before retry number attempt: the server's Retry-After
// when it sent one (it knows its own limits better than we do), else
// BaseBackoff doubled per attempt, capped at MaxBackoff, with "equal jitter"
// (a uniform draw from the upper half) so that many lanes hitting the same
// limit do not retry in lockstep.
func (o *OpenAI) backoff(attempt int, err error) time.Duration {
	var apiErr *APIError
	if errors.As(err, &apiErr) && apiErr.RetryAfter > 0 {
		return apiErr.RetryAfter
	}
	return backoff.Policy{First: o.cfg.baseBackoff(), Max: o.cfg.maxBackoff(), Jitter: true}.Wait(attempt)
}

// chatMessages builds the request: the condensing prompt as the system
// message (with a manual request's instructions appended), then each
// message under its own role. Messages that render to nothing (an assistant
// turn holding only reasoning) are skipped, since several OpenAI-compatible
// servers reject empty content.
func chatMessages(req schema.SummaryRequest) []openai.ChatCompletionMessage {
	out := make([]openai.ChatCompletionMessage, 0, len(req.Messages)+1)
	if p := strings.TrimSpace(prompts.WithInstructions(req.Prompt, req.Instructions)); p != "" {
		out = append(out, openai.ChatCompletionMessage{Role: openai.ChatMessageRoleSystem, Content: p})
	}
	for _, m := range req.Messages {
		text := RenderContent(m.Content)
		if strings.TrimSpace(text) == "" {
			continue
		}
		role := openai.ChatMessageRoleUser
		if m.Role == schema.RoleAssistant {
			role = openai.ChatMessageRoleAssistant
		}
		out = append(out, openai.ChatCompletionMessage{Role: role, Content: text})
	}
	return out
}
