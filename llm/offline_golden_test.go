package llm

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ctxpipe/ctxpipe/prompts"
	"github.com/ctxpipe/ctxpipe/schema"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata/offline_chain.golden from the current output")

// goldenFile holds, per run, a SHA-256 of every offline summary of its
// condenseChain and of the summary of the whole run at once, written before
// the extraction was rewritten: the whole summaries (counts, orders, lists,
// errors) must come out byte-identical.
const goldenFile = "testdata/offline_chain.golden"

func TestOfflineChainGolden(t *testing.T) {
	var got []string
	for _, r := range allTranscripts(t) {
		h := sha256.New()
		texts := condenseChain(t, r.msgs)
		whole, err := (&Offline{}).Summarize(context.Background(), schema.SummaryRequest{Prompt: prompts.Detailed, Messages: r.msgs})
		if err != nil {
			t.Fatal(err)
		}
		texts = append(texts, whole.Text)
		for _, s := range texts {
			fmt.Fprintf(h, "%d\n%s\n", len(s), s)
		}
		got = append(got, fmt.Sprintf("%s %d %s", r.name, len(texts), hex.EncodeToString(h.Sum(nil))))
	}
	if *updateGolden {
		if err := os.MkdirAll(filepath.Dir(goldenFile), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(goldenFile, []byte(strings.Join(got, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	fh, err := os.Open(goldenFile)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	var want []string
	for sc := bufio.NewScanner(fh); sc.Scan(); {
		want = append(want, sc.Text())
	}
	if len(got) != len(want) {
		t.Fatalf("%d runs, golden has %d", len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("summaries changed:\n got  %s\n want %s", got[i], want[i])
		}
	}
}
