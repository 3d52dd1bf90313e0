package condense

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/ctxpipe/ctxpipe/internal/openaitest"
	"github.com/ctxpipe/ctxpipe/schema"
)

func TestRouterPick(t *testing.T) {
	tests := []struct {
		name       string
		cfg        Config
		profile    schema.Profile
		wantOpenAI bool
	}{
		{"nothing configured", Config{}, schema.Profile{ID: "p"}, false},
		{"only a key", Config{APIKey: "sk"}, schema.Profile{LLM: schema.LLMConfig{APIKeyEnv: "X"}}, false},
		{"config model", Config{Model: "gpt"}, schema.Profile{}, true},
		{"config base url", Config{BaseURL: "http://localhost:11434/v1"}, schema.Profile{}, true},
		{"profile llm base url", Config{}, schema.Profile{LLM: schema.LLMConfig{BaseURL: "http://h/v1"}}, true},
		{"profile llm model", Config{}, schema.Profile{LLM: schema.LLMConfig{Model: "m"}}, true},
		{"profile condense model", Config{}, schema.Profile{CondenseLLM: schema.LLMConfig{Model: "cheap"}}, true},
		{"blank strings", Config{Model: "  "}, schema.Profile{LLM: schema.LLMConfig{BaseURL: " "}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := NewRouter(tt.cfg, nil).Pick(tt.profile)
			_, isOpenAI := got.(*OpenAI)
			_, isOffline := got.(*Offline)
			if isOpenAI != tt.wantOpenAI || isOffline == tt.wantOpenAI {
				t.Errorf("Pick = %T, want OpenAI %v", got, tt.wantOpenAI)
			}
		})
	}
}

func TestRouterSummarize(t *testing.T) {
	srv := openaitest.New(t)
	r := NewRouter(Config{}, nil)

	// A profile with an endpoint goes to the server...
	withLLM := schema.Profile{ID: "a", LLM: schema.LLMConfig{BaseURL: srv.URL(), Model: "local"}}
	sum, err := r.Summarize(context.Background(), simpleRequest(withLLM))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(sum.Text, "Summary of 3 messages. First request: Fix the failing test in parser.go") || sum.Model != "local" || srv.Count() != 1 {
		t.Errorf("LLM summary = %+v, count %d", sum, srv.Count())
	}

	// ...and one without stays offline.
	sum, err = r.Summarize(context.Background(), simpleRequest(schema.Profile{ID: "b"}))
	if err != nil {
		t.Fatal(err)
	}
	if sum.Model != OfflineModel || !strings.Contains(sum.Text, "Fix the failing test in parser.go") || srv.Count() != 1 {
		t.Errorf("offline summary = %+v, count %d", sum, srv.Count())
	}
}

func TestConfigFromEnv(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want Config
	}{
		{"empty", map[string]string{}, Config{}},
		{"ctxpipe vars", map[string]string{
			EnvBaseURL: "http://vllm:8000/v1", EnvOpenAIBaseURL: "http://ignored/v1", EnvModel: "qwen",
			DefaultAPIKeyEnv: "sk-1", EnvTimeout: "45s", EnvMaxAttempts: "2", EnvRetryBudget: "90",
		}, Config{BaseURL: "http://vllm:8000/v1", Model: "qwen", APIKey: "sk-1", Timeout: 45 * time.Second, MaxAttempts: 2, RetryBudget: 90 * time.Second}},
		{"openai base url fallback and named key", map[string]string{
			EnvOpenAIBaseURL: "http://litellm:4000", EnvAPIKeyEnv: "MY_KEY", "MY_KEY": "sk-2", DefaultAPIKeyEnv: "sk-ignored",
		}, Config{BaseURL: "http://litellm:4000", APIKey: "sk-2"}},
		{"bad numbers are ignored", map[string]string{EnvTimeout: "soon", EnvMaxAttempts: "-3", EnvRetryBudget: "0"}, Config{}},
	}
	all := []string{EnvBaseURL, EnvOpenAIBaseURL, EnvModel, EnvAPIKeyEnv, EnvTimeout, EnvMaxAttempts, EnvRetryBudget, DefaultAPIKeyEnv, "MY_KEY"}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, k := range all {
				t.Setenv(k, tt.env[k])
			}
			got := ConfigFromEnv()
			if got.BaseURL != tt.want.BaseURL || got.Model != tt.want.Model || got.APIKey != tt.want.APIKey ||
				got.Timeout != tt.want.Timeout || got.MaxAttempts != tt.want.MaxAttempts || got.RetryBudget != tt.want.RetryBudget {
				t.Errorf("ConfigFromEnv() = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestEndpointDefaults(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		profile schema.Profile
		want    Endpoint
	}{
		{"defaults", Config{Model: "m"}, schema.Profile{}, Endpoint{BaseURL: DefaultBaseURL, Model: "m", Timeout: DefaultTimeout}},
		{"config timeout", Config{Model: "m", Timeout: time.Second}, schema.Profile{}, Endpoint{BaseURL: DefaultBaseURL, Model: "m", Timeout: time.Second}},
		{"profile timeout", Config{Timeout: time.Second}, schema.Profile{LLM: schema.LLMConfig{TimeoutSeconds: 30}},
			Endpoint{BaseURL: DefaultBaseURL, Timeout: 30 * time.Second}},
		{"condense timeout wins", Config{}, schema.Profile{LLM: schema.LLMConfig{TimeoutSeconds: 30}, CondenseLLM: schema.LLMConfig{TimeoutSeconds: 5}},
			Endpoint{BaseURL: DefaultBaseURL, Timeout: 5 * time.Second}},
		{"named key variable unset means no key", Config{APIKey: "sk-cfg", Getenv: func(string) string { return "" }},
			schema.Profile{LLM: schema.LLMConfig{APIKeyEnv: "CTXPIPE_LLM_KEY_NOPE"}}, Endpoint{BaseURL: DefaultBaseURL, Timeout: DefaultTimeout}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.cfg.Endpoint(tt.profile); got != tt.want {
				t.Errorf("Endpoint = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestRenderContent(t *testing.T) {
	nested := schema.BlockContent(schema.Block{Type: schema.BlockText, Text: "out"}, schema.Block{Type: schema.BlockImage})
	tests := []struct {
		name string
		in   schema.Content
		want string
	}{
		{"string", schema.TextContent("hi <b>&</b>"), "hi <b>&</b>"},
		{"empty", schema.Content{}, ""},
		{"tool use keeps raw input bytes", schema.BlockContent(schema.Block{Type: schema.BlockToolUse, ID: "t1", Name: "edit",
			Input: json.RawMessage(`{"z":1, "a":"<x>"}`)}), `[tool call edit, id t1] {"z":1, "a":"<x>"}`},
		{"tool use without input", schema.BlockContent(schema.Block{Type: schema.BlockToolUse, ID: "t2", Name: "submit"}), "[tool call submit, id t2] {}"},
		{"tool result with block content", schema.BlockContent(schema.Block{Type: schema.BlockToolResult, ToolUseID: "t1", Content: &nested}),
			"[tool result for t1]\nout\n\n[image]"},
		{"empty tool result", schema.BlockContent(schema.Block{Type: schema.BlockToolResult, ToolUseID: "t1", IsError: true}), "[tool result for t1] [error]"},
		{"reasoning dropped", schema.BlockContent(schema.Block{Type: schema.BlockReasoning, Text: "think"}, schema.Block{Type: schema.BlockText, Text: "say"}), "say"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := RenderContent(tt.in); got != tt.want {
				t.Errorf("RenderContent = %q, want %q", got, tt.want)
			}
		})
	}
}
