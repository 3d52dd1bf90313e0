package pipeline_test

import openai "github.com/sashabaranov/go-openai"

type openaiRequest = openai.ChatCompletionRequest
