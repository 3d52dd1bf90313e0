package openaitest_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	openai "github.com/sashabaranov/go-openai"

	"github.com/ctxpipe/ctxpipe/internal/openaitest"
)

func client(baseURL, key string) *openai.Client {
	cfg := openai.DefaultConfig(key)
	cfg.BaseURL = baseURL
	return openai.NewClientWithConfig(cfg)
}

func chatReq() openai.ChatCompletionRequest {
	return openai.ChatCompletionRequest{
		Model: "gpt-test",
		Messages: []openai.ChatCompletionMessage{
			{Role: openai.ChatMessageRoleSystem, Content: "be brief"},
			{Role: openai.ChatMessageRoleUser, Content: "fix the bug\nin parser.go"},
			{Role: openai.ChatMessageRoleAssistant, Content: "done"},
			{Role: openai.ChatMessageRoleUser, Content: "summarize"},
		},
	}
}

func TestDefaultReply(t *testing.T) {
	srv := openaitest.New(t)
	resp, err := client(srv.URL(), "").CreateChatCompletion(context.Background(), chatReq())
	if err != nil {
		t.Fatal(err)
	}
	if got, want := resp.Choices[0].Message.Content, "Summary of 3 messages. First request: fix the bug"; got != want {
		t.Errorf("content = %q, want %q", got, want)
	}
	if resp.Model != "gpt-test" || resp.Object != "chat.completion" || resp.ID == "" {
		t.Errorf("envelope = %q %q %q", resp.Model, resp.Object, resp.ID)
	}
	u := resp.Usage
	if u.PromptTokens <= 0 || u.CompletionTokens <= 0 || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
		t.Errorf("usage = %+v", u)
	}
	reqs := srv.Requests()
	if len(reqs) != 1 || reqs[0].Chat.Messages[0].Content != "be brief" || reqs[0].Path != "/v1/chat/completions" {
		t.Fatalf("recorded = %+v", reqs)
	}
}

func TestScriptedReplies(t *testing.T) {
	srv := openaitest.New(t, openaitest.WithAPIKey("sk-good"))
	srv.Enqueue(
		openaitest.Reply{Status: http.StatusTooManyRequests, RetryAfter: "7"},
		openaitest.Reply{Text: "hello", PromptTokens: 11, CompletionTokens: 2, Model: "served-model"},
		openaitest.Reply{RawBody: `{"id": "x", "choices": [`},
	)
	c := client(srv.URL(), "sk-good")
	ctx := context.Background()

	_, err := c.CreateChatCompletion(ctx, chatReq())
	var apiErr *openai.APIError
	if !errors.As(err, &apiErr) || apiErr.HTTPStatusCode != http.StatusTooManyRequests {
		t.Fatalf("first: err = %v, want a 429 APIError", err)
	}

	resp, err := c.CreateChatCompletion(ctx, chatReq())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Choices[0].Message.Content != "hello" || resp.Model != "served-model" ||
		resp.Usage.PromptTokens != 11 || resp.Usage.CompletionTokens != 2 || resp.Usage.TotalTokens != 13 {
		t.Errorf("second = %+v", resp)
	}

	if _, err := c.CreateChatCompletion(ctx, chatReq()); err == nil {
		t.Error("malformed body: want an error")
	}
	if srv.Pending() != 0 || srv.Count() != 3 {
		t.Errorf("pending %d count %d", srv.Pending(), srv.Count())
	}
}

func TestRetryAfterHeader(t *testing.T) {
	srv := openaitest.New(t)
	srv.Enqueue(openaitest.Reply{Status: 503, RetryAfter: "3"})
	resp, err := http.Post(srv.URL()+"/chat/completions", "application/json", strings.NewReader(`{"model":"m","messages":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "3" || !strings.Contains(string(body), `"server_error"`) {
		t.Errorf("status %d retry-after %q body %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
}

func TestAuth(t *testing.T) {
	tests := []struct {
		name   string
		key    string
		wantOK bool
	}{
		{"right key", "sk-right", true},
		{"wrong key", "sk-wrong", false},
		{"no key", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := openaitest.New(t, openaitest.WithAPIKey("sk-right"))
			_, err := client(srv.URL(), tt.key).CreateChatCompletion(context.Background(), chatReq())
			if (err == nil) != tt.wantOK {
				t.Fatalf("err = %v, wantOK %v", err, tt.wantOK)
			}
			if !tt.wantOK {
				var apiErr *openai.APIError
				if !errors.As(err, &apiErr) || apiErr.HTTPStatusCode != http.StatusUnauthorized {
					t.Errorf("err = %v, want 401", err)
				}
			}
			if srv.Count() != 1 {
				t.Errorf("count = %d", srv.Count())
			}
		})
	}
}

func TestHandlerAndRootPath(t *testing.T) {
	srv := openaitest.New(t)
	srv.SetHandler(func(req openai.ChatCompletionRequest) openaitest.Reply {
		return openaitest.Reply{Text: "model was " + req.Model}
	})
	resp, err := client(srv.RootURL(), "").CreateChatCompletion(context.Background(), chatReq())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Choices[0].Message.Content != "model was gpt-test" {
		t.Errorf("content = %q", resp.Choices[0].Message.Content)
	}
	if p := srv.Requests()[0].Path; p != "/chat/completions" {
		t.Errorf("path = %q", p)
	}
}

func TestStream(t *testing.T) {
	srv := openaitest.New(t)
	srv.Enqueue(openaitest.Reply{Text: "one two three", PromptTokens: 5, CompletionTokens: 3})
	req := chatReq()
	req.Stream = true
	req.StreamOptions = &openai.StreamOptions{IncludeUsage: true}
	stream, err := client(srv.URL(), "").CreateChatCompletionStream(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	var text strings.Builder
	var usage *openai.Usage
	finish := openai.FinishReason("")
	for {
		chunk, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if chunk.Usage != nil {
			usage = chunk.Usage
		}
		for _, c := range chunk.Choices {
			text.WriteString(c.Delta.Content)
			if c.FinishReason != "" {
				finish = c.FinishReason
			}
		}
	}
	if text.String() != "one two three" || finish != openai.FinishReasonStop {
		t.Errorf("text %q finish %q", text.String(), finish)
	}
	if usage == nil || usage.TotalTokens != 8 {
		t.Errorf("usage = %+v", usage)
	}
}

func TestBadRequests(t *testing.T) {
	srv := openaitest.New(t)
	tests := []struct {
		method, path, body string
		want               int
	}{
		{http.MethodPost, "/v1/embeddings", `{}`, http.StatusNotFound},
		{http.MethodGet, "/v1/chat/completions", ``, http.StatusMethodNotAllowed},
		{http.MethodPost, "/v1/chat/completions", `{not json`, http.StatusBadRequest},
	}
	for _, tt := range tests {
		req, _ := http.NewRequest(tt.method, srv.RootURL()+tt.path, strings.NewReader(tt.body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tt.want {
			t.Errorf("%s %s: status %d, want %d", tt.method, tt.path, resp.StatusCode, tt.want)
		}
	}
}
