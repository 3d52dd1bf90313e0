// Package llm holds ctxpipe's condensers, the implementations of the engine's
// Summarizer:
//
//   - OpenAI calls any OpenAI-compatible chat completions endpoint (OpenAI,
//     Ollama, vLLM, llama.cpp server, LiteLLM) with go-openai, one
//     non-streaming request per summary, retrying transient failures within
//     an attempt count and a time budget (see the Err* classes in errors.go).
//   - Offline writes a deterministic, bounded, extractive summary with no
//     network at all: the default when no endpoint is configured.
//   - Router chooses between them per request from the profile and the Config.
//
// Where a request goes is resolved per profile by Config.Endpoint:
// condense_llm fields override llm fields, which override the Config that
// cmd/consumer fills with ConfigFromEnv.
package llm
