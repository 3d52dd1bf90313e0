package condense

import (
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ctxpipe/ctxpipe/schema"
)

// Defaults applied when a Config field or the profile leaves a value unset.
const (
	// DefaultBaseURL is used when a model is named but no base URL is.
	DefaultBaseURL = "https://api.openai.com/v1"
	// DefaultAPIKeyEnv names the variable that holds the API key.
	DefaultAPIKeyEnv = "OPENAI_API_KEY"
	// DefaultTimeout bounds one attempt (Roo and Gemini leave summary calls
	// unbounded; a stuck condense would hold its lane, so we bound it).
	DefaultTimeout     = 120 * time.Second
	DefaultMaxAttempts = 4
	// DefaultRetryBudget bounds the time spent retrying one summary, so a
	// provider that keeps failing cannot hold a conversation's lane for long.
	DefaultRetryBudget = 3 * time.Minute
	DefaultBaseBackoff = 500 * time.Millisecond
	DefaultMaxBackoff  = 30 * time.Second
)

// Environment variables read by ConfigFromEnv.
const (
	EnvBaseURL       = "CTXPIPE_LLM_BASE_URL"
	EnvOpenAIBaseURL = "OPENAI_BASE_URL" // read when EnvBaseURL is unset
	EnvModel         = "CTXPIPE_LLM_MODEL"
	// EnvAPIKeyEnv names the variable holding the key (default OPENAI_API_KEY).
	EnvAPIKeyEnv   = "CTXPIPE_LLM_API_KEY_ENV"
	EnvTimeout     = "CTXPIPE_LLM_TIMEOUT"      // Go duration ("90s") or whole seconds
	EnvMaxAttempts = "CTXPIPE_LLM_MAX_ATTEMPTS" // positive integer
	EnvRetryBudget = "CTXPIPE_LLM_RETRY_BUDGET" // Go duration or whole seconds
)

// Config holds the service-wide LLM defaults. A profile's llm and
// condense_llm fields override BaseURL, Model, the key and the timeout per
// request; the zero Config is valid and selects the offline condenser in a
// Router.
type Config struct {
	// BaseURL of an OpenAI-compatible API, e.g. http://localhost:11434/v1 for
	// Ollama. Empty with a Model set means DefaultBaseURL.
	BaseURL string
	// Model is the default summarization model.
	Model string
	// APIKey is sent as a bearer token when not empty; local servers need none.
	APIKey string
	// Timeout bounds one attempt; 0 means DefaultTimeout.
	Timeout time.Duration
	// MaxAttempts bounds the attempts per summary, first one included; 0 means DefaultMaxAttempts.
	MaxAttempts int
	// RetryBudget bounds the time from the first attempt after which no
	// retry starts; 0 means DefaultRetryBudget.
	RetryBudget time.Duration
	// BaseBackoff is the wait before the first retry, doubled for each next
	// one (with jitter) up to MaxBackoff; 0 means the defaults.
	BaseBackoff time.Duration
	MaxBackoff  time.Duration
	// HTTPClient is used for every request; nil means a plain http.Client
	// (timeouts come from the per-attempt context instead).
	HTTPClient *http.Client
	// Getenv looks up a profile's api_key_env; nil means os.Getenv.
	Getenv func(string) string
}

// ConfigFromEnv reads the defaults from the environment: the base URL from
// CTXPIPE_LLM_BASE_URL (else OPENAI_BASE_URL), the model from
// CTXPIPE_LLM_MODEL, the key from the variable named by
// CTXPIPE_LLM_API_KEY_ENV (else OPENAI_API_KEY), and optionally
// CTXPIPE_LLM_TIMEOUT, CTXPIPE_LLM_MAX_ATTEMPTS and CTXPIPE_LLM_RETRY_BUDGET.
// Values that do not parse are ignored, leaving the default.
func ConfigFromEnv() Config {
	c := Config{
		BaseURL: strings.TrimSpace(os.Getenv(EnvBaseURL)),
		Model:   strings.TrimSpace(os.Getenv(EnvModel)),
	}
	if c.BaseURL == "" {
		c.BaseURL = strings.TrimSpace(os.Getenv(EnvOpenAIBaseURL))
	}
	keyEnv := strings.TrimSpace(os.Getenv(EnvAPIKeyEnv))
	if keyEnv == "" {
		keyEnv = DefaultAPIKeyEnv
	}
	c.APIKey = strings.TrimSpace(os.Getenv(keyEnv))
	c.Timeout = envDuration(EnvTimeout)
	c.RetryBudget = envDuration(EnvRetryBudget)
	if n, err := strconv.Atoi(strings.TrimSpace(os.Getenv(EnvMaxAttempts))); err == nil && n > 0 {
		c.MaxAttempts = n
	}
	return c
}

func envDuration(name string) time.Duration {
	v := strings.TrimSpace(os.Getenv(name))
	if v == "" {
		return 0
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return d
	}
	if n, err := strconv.Atoi(v); err == nil && n > 0 {
		return time.Duration(n) * time.Second
	}
	return 0
}

// Endpoint is the resolved target of one summarization request.
type Endpoint struct {
	BaseURL string
	Model   string
	APIKey  string
	Timeout time.Duration
}

// Configured reports whether the profile or the config names an endpoint
// (a base URL or a model anywhere); if not, there is nothing to call and the
// offline condenser is the only choice.
func (c Config) Configured(p schema.Profile) bool {
	for _, s := range []string{p.CondenseLLM.BaseURL, p.CondenseLLM.Model, p.LLM.BaseURL, p.LLM.Model, c.BaseURL, c.Model} {
		if strings.TrimSpace(s) != "" {
			return true
		}
	}
	return false
}

// Endpoint resolves where a profile's summaries go: each condense_llm field
// overrides the llm field, which overrides the Config. The key is read from
// the variable named by api_key_env (condense_llm's, else llm's) when one is
// named, else it is Config.APIKey. An empty model is sent as is: single-model
// servers such as llama.cpp accept it.
func (c Config) Endpoint(p schema.Profile) Endpoint {
	e := Endpoint{
		BaseURL: first(p.CondenseLLM.BaseURL, p.LLM.BaseURL, c.BaseURL, DefaultBaseURL),
		Model:   first(p.CondenseLLM.Model, p.LLM.Model, c.Model),
		APIKey:  c.APIKey,
		Timeout: c.timeout(),
	}
	// Validate refuses a profile naming any other variable; one that got
	// here anyway (a caller that skipped validation) gets no key at all
	// rather than the value of whatever it named.
	if env := first(p.CondenseLLM.APIKeyEnv, p.LLM.APIKeyEnv); env != "" {
		if !schema.KeyEnvAllowed(env) {
			e.APIKey = ""
			return e.withTimeout(p)
		}
		getenv := c.Getenv
		if getenv == nil {
			getenv = os.Getenv
		}
		e.APIKey = strings.TrimSpace(getenv(env))
	}
	return e.withTimeout(p)
}

// withTimeout applies the profile's timeout_seconds (condense_llm's, else
// llm's) to e.
func (e Endpoint) withTimeout(p schema.Profile) Endpoint {
	if s := p.CondenseLLM.TimeoutSeconds; s > 0 {
		e.Timeout = time.Duration(s) * time.Second
	} else if s := p.LLM.TimeoutSeconds; s > 0 {
		e.Timeout = time.Duration(s) * time.Second
	}
	return e
}

func (c Config) timeout() time.Duration     { return orDur(c.Timeout, DefaultTimeout) }
func (c Config) retryBudget() time.Duration { return orDur(c.RetryBudget, DefaultRetryBudget) }
func (c Config) baseBackoff() time.Duration { return orDur(c.BaseBackoff, DefaultBaseBackoff) }
func (c Config) maxBackoff() time.Duration  { return orDur(c.MaxBackoff, DefaultMaxBackoff) }

func (c Config) maxAttempts() int {
	if c.MaxAttempts > 0 {
		return c.MaxAttempts
	}
	return DefaultMaxAttempts
}

func orDur(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

func first(vals ...string) string {
	for _, v := range vals {
		if v = strings.TrimSpace(v); v != "" {
			return v
		}
	}
	return ""
}
