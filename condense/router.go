package condense

import (
	"context"
	"log/slog"

	"github.com/ctxpipe/ctxpipe/schema"
)

// Router picks a condenser per request: the OpenAI summarizer when the
// request's profile or the Config names an endpoint (a base URL or a model),
// else the offline one. This lets one service run with no LLM at all and
// still give a profile a real model by editing that profile alone.
type Router struct {
	cfg     Config
	log     *slog.Logger
	openai  *OpenAI
	offline *Offline
}

// NewRouter returns a Router over cfg; log may be nil.
func NewRouter(cfg Config, log *slog.Logger) *Router {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Router{cfg: cfg, log: log, openai: NewOpenAI(cfg, log), offline: &Offline{}}
}

// Pick returns the condenser that serves profile p: an *OpenAI or an *Offline.
func (r *Router) Pick(p schema.Profile) Summarizer {
	if r.cfg.Configured(p) {
		return r.openai
	}
	return r.offline
}

// Summarize condenses with the condenser Pick chooses for req.Profile. A
// failure of the LLM is returned as is, not papered over with the offline
// summary: the engine reports it as condense_failed and truncates instead,
// which keeps the outcome visible to the operator.
func (r *Router) Summarize(ctx context.Context, req schema.SummaryRequest) (schema.Summary, error) {
	return r.Pick(req.Profile).Summarize(ctx, req)
}
