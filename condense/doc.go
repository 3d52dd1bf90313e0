// Package condense holds ctxpipe's condensers, the implementations of the
// engine's Summarizer:
//
//   - OpenAI (openai.go) calls any OpenAI-compatible chat completions
//     endpoint (OpenAI, Ollama, vLLM, llama.cpp server, LiteLLM) with
//     go-openai, one non-streaming request per summary, retrying transient
//     failures within an attempt count and a time budget (the Err* classes
//     in errors.go); RenderContent (content.go) is how a message reads to it.
//   - Offline (offline.go) writes a deterministic, bounded, extractive
//     summary with no network at all, the default when no endpoint is
//     configured: facts.go pulls the facts out of the span, render.go writes
//     them under the Detailed prompt's headings, budget.go bounds each
//     section.
//   - Router (router.go) chooses between them per request from the profile
//     and the Config.
//
// Where a request goes is resolved per profile by Config.Endpoint
// (config.go): condense_llm fields override llm fields, which override the
// Config that cmd/consumer fills with ConfigFromEnv. Both summarizers end
// with the files-touched list of textfacts, the facts they share with the
// engine.
package condense
