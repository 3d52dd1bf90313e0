package schema

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
)

// Strategy selects how a conversation is condensed.
type Strategy string

// The condense strategies.
const (
	// StrategyKeepTail keeps the first message and the last three, and puts an
	// assistant summary before the kept tail (Roo Code up to 3.42).
	StrategyKeepTail Strategy = "keep_tail"
	// StrategyFreshStart hides everything and appends a user summary
	// (Roo Code 3.43 and later).
	StrategyFreshStart Strategy = "fresh_start"
	// StrategyPreserveFraction summarizes the oldest 70 % of the characters,
	// splitting at a user turn (Gemini CLI).
	StrategyPreserveFraction Strategy = "preserve_fraction"
)

// Counter names how a profile counts tokens.
type CounterKind string

// Token counters.
const (
	CounterO200K CounterKind = "o200k" // exact o200k_base (the default)
	CounterChars CounterKind = "chars" // Gemini's character heuristic: cheap, approximate
)

// Threshold bounds (Roo's MIN_/MAX_CONDENSE_THRESHOLD).
const (
	MinCondenseThreshold = 5
	MaxCondenseThreshold = 100
	// InheritThreshold in a profile means "use the global percent".
	InheritThreshold = -1
	// DefaultMaxTokens is reserved for the reply when a profile names none
	// (Roo's ANTHROPIC_DEFAULT_MAX_TOKENS).
	DefaultMaxTokens = 8192
	// DefaultFudgeFactor scales local counts up, once per message (Roo's TOKEN_FUDGE_FACTOR).
	DefaultFudgeFactor = 1.5
	// DefaultProfileID is used by turns that name no profile.
	DefaultProfileID = "default"
)

// Bounds on a profile's numbers, checked by Profile.Validate. Profiles come
// from operators, but a typo must not turn into a wrapped count, an instant
// timeout or a NaN cost. context_window and max_tokens are bounded by
// MaxTokenCount.
const (
	// MaxFudgeFactor bounds fudge_factor, which must be in (0, 10] when set
	// (0 or absent means DefaultFudgeFactor). Counts are multiplied by it.
	MaxFudgeFactor = 10.0
	// MaxLLMTimeoutSeconds bounds timeout_seconds of llm and condense_llm:
	// an hour, far above any summarization request.
	MaxLLMTimeoutSeconds = 3600
	// MaxPricePerMTok bounds each price, in USD per million tokens.
	MaxPricePerMTok = 10_000.0
)

// The variables a profile's api_key_env may name. Whoever writes profiles
// must not be able to make the service send one of its other variables
// (its NATS password, say) as a bearer token to a URL of their choosing:
// the operator puts the keys profiles may use in variables with this
// prefix (or in OPENAI_API_KEY), and nothing else is read for a profile.
const (
	DefaultKeyEnv = "OPENAI_API_KEY"
	KeyEnvPrefix  = "CTXPIPE_LLM_KEY_"
	// maxKeyEnvLen bounds the name: environment names are short.
	maxKeyEnvLen = 128
)

// MaxProfileIDBytes bounds a profile id. An id is a key of the profiles
// bucket, read with a subject of its own: one of several kilobytes would
// make the server close the service's connection (its control line is 4 KiB).
const MaxProfileIDBytes = 128

// ValidProfileID reports whether id can name a profile: 1 to
// MaxProfileIDBytes of letters, digits and - _ = / . (a key of the profiles
// bucket), neither starting nor ending with a dot, nor holding two in a row
// (the bucket refuses such a key, and the service could not seed it).
func ValidProfileID(id string) bool {
	if id == "" || len(id) > MaxProfileIDBytes || id[0] == '.' || id[len(id)-1] == '.' || strings.Contains(id, "..") {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-_=/.", c) >= 0) {
			return false
		}
	}
	return true
}

// KeyEnvAllowed reports whether a profile may name the variable env as
// the one holding its API key: DefaultKeyEnv, or KeyEnvPrefix followed by
// upper-case letters, digits and underscores.
func KeyEnvAllowed(env string) bool {
	if env == DefaultKeyEnv {
		return true
	}
	rest, ok := strings.CutPrefix(env, KeyEnvPrefix)
	if !ok || rest == "" || len(env) > maxKeyEnvLen {
		return false
	}
	for _, c := range rest {
		if !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// LLMConfig says which OpenAI-compatible endpoint and model to use.
type LLMConfig struct {
	BaseURL   string `json:"base_url,omitempty"`
	Model     string `json:"model,omitempty"`
	APIKeyEnv string `json:"api_key_env,omitempty"`
	// TimeoutSeconds bounds one summarization request (default 120).
	TimeoutSeconds int `json:"timeout_seconds,omitempty"`
}

// Prices are USD per million tokens, used for an event's cost.
type Prices struct {
	InputPerMTok  float64 `json:"input_per_mtok"`
	OutputPerMTok float64 `json:"output_per_mtok"`
}

// Cost returns the USD cost of a request with the given token counts.
func (p Prices) Cost(in, out int) float64 {
	return (float64(in)*p.InputPerMTok + float64(out)*p.OutputPerMTok) / 1e6
}

// Profile is a model's context settings, stored in the ctx_profiles KV bucket.
type Profile struct {
	ID            string `json:"id"`
	ContextWindow int    `json:"context_window"`
	MaxTokens     int    `json:"max_tokens,omitempty"`
	// AutoCondense nil means "use the service default".
	AutoCondense *bool `json:"auto_condense,omitempty"`
	// CondenseThreshold is a percent of the window: -1 or absent inherits
	// the global, 5..100 is used, anything else falls back with a warning.
	CondenseThreshold *int        `json:"condense_threshold,omitempty"`
	Strategy          Strategy    `json:"strategy,omitempty"`
	FudgeFactor       float64     `json:"fudge_factor,omitempty"`
	Counter           CounterKind `json:"counter,omitempty"`
	CustomPrompt      string      `json:"custom_prompt,omitempty"`
	LLM               LLMConfig   `json:"llm,omitempty"`
	CondenseLLM       LLMConfig   `json:"condense_llm,omitempty"`
	Prices            Prices      `json:"prices,omitempty"`
	// Mask configures observation masking, tried before any condense.
	Mask MaskSettings `json:"mask,omitempty"`
	// KeepTask nil or true keeps the first user message (the task) and the
	// latest user instruction verbatim in the effective history through
	// every reduction; false lets a summary stand in for them.
	KeepTask *bool `json:"keep_task,omitempty"`
	// MinGainTokens: an automatic condense or masking that would free fewer
	// tokens is not made, since each one breaks the agent's prompt cache.
	// nil means DefaultMinGainTokens; 0 turns the check off. Manual and
	// forced (overflow) condenses are exempt.
	MinGainTokens *int `json:"min_gain_tokens,omitempty"`
}

// MaskSettings are a profile's observation masking: when the
// threshold is crossed, the bodies of older tool results are replaced in the
// effective history by a one-line stand-in, and a condense runs only if the
// context is still over the threshold.
type MaskSettings struct {
	Enabled bool `json:"enabled,omitempty"`
	// KeepLast tool results (the most recent) stay whole; nil means
	// DefaultMaskKeepLast.
	KeepLast *int `json:"keep_last,omitempty"`
	// ExcludeTools are tool names whose results are never masked.
	ExcludeTools []string `json:"exclude_tools,omitempty"`
	// MinGainTokens overrides the profile's min_gain_tokens for masking.
	MinGainTokens *int `json:"min_gain_tokens,omitempty"`
}

// Masking and minimum-gain defaults and bounds.
const (
	// DefaultMaskKeepLast is how many recent tool results masking keeps whole.
	DefaultMaskKeepLast = 3
	// DefaultMinGainTokens is the least an automatic reduction must free:
	// about one screen of tool output, far below any window's threshold
	// margin yet above the cost of re-reading a broken prompt cache for a
	// handful of tokens. Capped at 5 % of the window for small windows.
	DefaultMinGainTokens = 1000
	// MaxMaskExcludeTools bounds mask.exclude_tools, and MaxToolNameLen each name.
	MaxMaskExcludeTools = 100
	MaxToolNameLen      = 128
	// MaxMaskKeepLast bounds mask.keep_last.
	MaxMaskKeepLast = 10_000
)

// MaskKeepLast is mask.keep_last, or DefaultMaskKeepLast when unset.
func (p *Profile) MaskKeepLast() int {
	if p.Mask.KeepLast != nil {
		return *p.Mask.KeepLast
	}
	return DefaultMaskKeepLast
}

// MinGain is min_gain_tokens, or DefaultMinGainTokens capped at 5 % of the
// context window when unset.
func (p *Profile) MinGain() int {
	if p.MinGainTokens != nil {
		return *p.MinGainTokens
	}
	return min(DefaultMinGainTokens, p.ContextWindow/20)
}

// MaskMinGain is mask.min_gain_tokens, or the profile's MinGain.
func (p *Profile) MaskMinGain() int {
	if p.Mask.MinGainTokens != nil {
		return *p.Mask.MinGainTokens
	}
	return p.MinGain()
}

// KeepsTask reports keep_task, true when unset.
func (p *Profile) KeepsTask() bool { return p.KeepTask == nil || *p.KeepTask }

// Validate checks the fields that cannot fall back to a default, and bounds
// every number. condense_threshold is the exception: as in Roo, a value
// outside 5..100 (other than -1) falls back to the global percent with a
// warning (EffectiveThreshold), which every int does safely.
func (p *Profile) Validate() error {
	if p.ID == "" {
		return Errorf(ReasonBadProfile, "profile needs an id")
	}
	if !ValidProfileID(p.ID) {
		return Errorf(ReasonBadProfile, "profile id %.40q…: at most %d letters, digits and - _ = / ., no dot first, last or next to another", p.ID, MaxProfileIDBytes)
	}
	if p.ContextWindow <= 0 || p.ContextWindow > MaxTokenCount {
		return Errorf(ReasonBadProfile, "profile %q: context_window must be in [1, %d]", p.ID, MaxTokenCount)
	}
	if p.MaxTokens < 0 || p.MaxTokens >= p.ContextWindow {
		return Errorf(ReasonBadProfile, "profile %q: max_tokens must be in [0, context_window)", p.ID)
	}
	switch p.Strategy {
	case "", StrategyKeepTail, StrategyFreshStart, StrategyPreserveFraction:
	default:
		return Errorf(ReasonBadProfile, "profile %q: unknown strategy %q", p.ID, p.Strategy)
	}
	switch p.Counter {
	case "", CounterO200K, CounterChars:
	default:
		return Errorf(ReasonBadProfile, "profile %q: unknown counter %q", p.ID, p.Counter)
	}
	// Written so that NaN fails too: every comparison with NaN is false.
	if !(p.FudgeFactor >= 0 && p.FudgeFactor <= MaxFudgeFactor) {
		return Errorf(ReasonBadProfile, "profile %q: fudge_factor must be in (0, %g], or 0 for the default", p.ID, MaxFudgeFactor)
	}
	for _, l := range []struct {
		name string
		c    LLMConfig
	}{{"llm", p.LLM}, {"condense_llm", p.CondenseLLM}} {
		if l.c.TimeoutSeconds < 0 || l.c.TimeoutSeconds > MaxLLMTimeoutSeconds {
			return Errorf(ReasonBadProfile, "profile %q: %s.timeout_seconds must be in [0, %d]", p.ID, l.name, MaxLLMTimeoutSeconds)
		}
		if l.c.APIKeyEnv != "" && !KeyEnvAllowed(l.c.APIKeyEnv) {
			return Errorf(ReasonBadProfile, "profile %q: %s.api_key_env must be %s or start with %s (an upper-case name)",
				p.ID, l.name, DefaultKeyEnv, KeyEnvPrefix)
		}
	}
	if k := p.Mask.KeepLast; k != nil && (*k < 0 || *k > MaxMaskKeepLast) {
		return Errorf(ReasonBadProfile, "profile %q: mask.keep_last must be in [0, %d]", p.ID, MaxMaskKeepLast)
	}
	if len(p.Mask.ExcludeTools) > MaxMaskExcludeTools {
		return Errorf(ReasonBadProfile, "profile %q: mask.exclude_tools has more than %d names", p.ID, MaxMaskExcludeTools)
	}
	for _, n := range p.Mask.ExcludeTools {
		if n == "" || len(n) > MaxToolNameLen {
			return Errorf(ReasonBadProfile, "profile %q: mask.exclude_tools names must be 1-%d bytes", p.ID, MaxToolNameLen)
		}
	}
	for _, g := range []struct {
		name string
		v    *int
	}{{"min_gain_tokens", p.MinGainTokens}, {"mask.min_gain_tokens", p.Mask.MinGainTokens}} {
		if g.v != nil && (*g.v < 0 || *g.v > MaxTokenCount) {
			return Errorf(ReasonBadProfile, "profile %q: %s must be in [0, %d]", p.ID, g.name, MaxTokenCount)
		}
	}
	for _, pr := range []struct {
		name string
		v    float64
	}{{"input_per_mtok", p.Prices.InputPerMTok}, {"output_per_mtok", p.Prices.OutputPerMTok}} {
		if !(pr.v >= 0 && pr.v <= MaxPricePerMTok) {
			return Errorf(ReasonBadProfile, "profile %q: prices.%s must be in [0, %g]", p.ID, pr.name, MaxPricePerMTok)
		}
	}
	return nil
}

// ReservedTokens is max_tokens, or 8192 when the profile names none.
func (p *Profile) ReservedTokens() int {
	if p.MaxTokens > 0 {
		return p.MaxTokens
	}
	return DefaultMaxTokens
}

// Fudge is the profile's fudge factor, 1.5 when unset.
func (p *Profile) Fudge() float64 {
	if p.FudgeFactor > 0 {
		return p.FudgeFactor
	}
	return DefaultFudgeFactor
}

// StrategyOrDefault is the profile's strategy, keep_tail when unset.
func (p *Profile) StrategyOrDefault() Strategy {
	if p.Strategy == "" {
		return StrategyKeepTail
	}
	return p.Strategy
}

// Globals are the service-wide defaults a profile inherits (Roo's
// autoCondenseContext and autoCondenseContextPercent).
type Globals struct {
	AutoCondense        bool
	AutoCondensePercent int
}

// DefaultGlobals are Roo Code's defaults.
func DefaultGlobals() Globals { return Globals{AutoCondense: true, AutoCondensePercent: 100} }

// AutoCondenseOr returns the profile's auto_condense, or g's when unset.
func (p *Profile) AutoCondenseOr(g Globals) bool {
	if p.AutoCondense != nil {
		return *p.AutoCondense
	}
	return g.AutoCondense
}

// Threshold resolves the profile's threshold against the global percent
// exactly as Roo does: absent or -1 inherits, 5..100 is used, any other
// value falls back to the global (no clamping). valid is false for such a
// value, which the caller warns about.
func (p *Profile) Threshold(global int) (percent int, valid bool) {
	if p.CondenseThreshold == nil || *p.CondenseThreshold == InheritThreshold {
		return global, true
	}
	v := *p.CondenseThreshold
	if v >= MinCondenseThreshold && v <= MaxCondenseThreshold {
		return v, true
	}
	return global, false
}

// EffectiveThreshold is Threshold that warns on log, when there is one,
// about a value it fell back from.
func (p *Profile) EffectiveThreshold(global int, log *slog.Logger) int {
	t, valid := p.Threshold(global)
	if !valid && log != nil {
		log.Warn("invalid profile condense threshold; using the global percent",
			"profile", p.ID, "threshold", *p.CondenseThreshold, "global", global)
	}
	return t
}

// DecodeProfile decodes and validates a profile document.
func DecodeProfile(data []byte) (Profile, error) {
	var p Profile
	if err := json.Unmarshal(data, &p); err != nil {
		return Profile{}, fmt.Errorf("decode profile: %w", err)
	}
	if err := p.Validate(); err != nil {
		return Profile{}, err
	}
	return p, nil
}
