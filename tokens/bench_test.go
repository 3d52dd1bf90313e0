package tokens

import (
	"fmt"
	"testing"

	"github.com/ctxpipe/ctxpipe/internal/transcripts"
	"github.com/ctxpipe/ctxpipe/schema"
)

// kindSamples are texts of each kind, varied so the piece cache does not see
// the same text twice in a row.
func kindSamples() map[string][]string {
	out := map[string][]string{}
	for i := 0; i < 200; i++ {
		out["prose"] = append(out["prose"], fmt.Sprintf("The %d-th request asked the agent to keep the conversation history intact while summarizing the older part. It read the files, ran the tests (%d passed, %d failed) and wrote down what it decided, so that the next turn could pick up where this one left off. ", i, 40+i, i%7))
		out["code"] = append(out["code"], fmt.Sprintf("func handle%d(ctx context.Context, in *Input) (*Result, error) {\n\tif in == nil {\n\t\treturn nil, fmt.Errorf(\"input %%d: %%w\", %d, ErrEmpty)\n\t}\n\tfor i := 0; i < len(in.Items); i++ {\n\t\tif err := process(ctx, in.Items[i]); err != nil {\n\t\t\treturn nil, err\n\t\t}\n\t}\n\treturn &Result{N: %d}, nil\n}\n", i, i, i))
		out["json"] = append(out["json"], fmt.Sprintf(`{"id":"call_%06d","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"src/pkg/mod%d/file.go\",\"start\":%d,\"end\":%d}"},"status":"ok","lines":[%d,%d,%d]}`, i, i%17, i, i+40, i, i*2, i*3))
		out["cjk"] = append(out["cjk"], fmt.Sprintf("第%d回の会話では、エージェントが古い履歴を要約し、最新の%d件のメッセージを保持しました。요약 후에도 도구 호출과 결과의 쌍은 유지됩니다。上下文窗口已达到%d%%。", i, i%5+3, 60+i%40))
	}
	return out
}

// BenchmarkCount is the engine's counter (o200k_base, fudge 1.5) per kind of
// text: MB/s from SetBytes, and tok/s (o200k tokens, before the fudge).
func BenchmarkCount(b *testing.B) {
	p := schema.Profile{}
	c, err := ForProfile(&p)
	if err != nil {
		b.Fatal(err)
	}
	for _, kind := range []string{"prose", "code", "json", "cjk"} {
		texts := kindSamples()[kind]
		size, toks := 0, 0
		for _, s := range texts {
			size += len(s)
			toks += c.Text.Count(s)
		}
		b.Run(kind, func(b *testing.B) {
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				for _, s := range texts {
					c.Content(schema.TextContent(s))
				}
			}
			b.ReportMetric(float64(toks)*float64(b.N)/b.Elapsed().Seconds(), "tok/s")
		})
	}
}

// BenchmarkCountTranscripts counts every message of the real agent runs
// (text, tool calls and tool results) as the pipeline does, once each.
func BenchmarkCountTranscripts(b *testing.B) {
	var contents []schema.Content
	size := 0
	for _, l := range transcripts.All(b, "../../shared/data/transcripts") {
		contents = append(contents, l.Turn.Content)
		size += len(l.Raw)
	}
	p := schema.Profile{FudgeFactor: 1}
	c, _ := ForProfile(&p)
	toks := 0
	for _, x := range contents {
		toks += c.Content(x)
	}
	b.SetBytes(int64(size))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, x := range contents {
			c.Content(x)
		}
	}
	b.ReportMetric(float64(toks)*float64(b.N)/b.Elapsed().Seconds(), "tok/s")
	b.ReportMetric(float64(len(contents))*float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}
