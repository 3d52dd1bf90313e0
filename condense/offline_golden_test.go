package condense

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

	"github.com/ctxpipe/ctxpipe/internal/transcripts"
	"github.com/ctxpipe/ctxpipe/prompts"
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/textfacts"
)

// syntheticGolden hashes the offline summary and the files list of inputs
// the real runs lack: commands given as arrays and under several keys, path
// arrays, top-level arrays and invalid JSON as inputs, a truncation marker
// holding a call, a masked failed result, a returncode and a traceback, and
// an earlier summary whose lists are carried forward.
func syntheticGolden(t *testing.T) string {
	t.Helper()
	earlier := "Offline extractive summary.\n\n## " + prompts.DetailedSections[3] + "\n- `old/a.go`\n- old/b.py\n- not a path\n\n## " +
		prompts.DetailedSections[4] + "\nNone.\n\n" + textfacts.FilesTouchedHeading + "\n- old/a.go (edited)\n- old/c.md (created)\n- bad line (read)\n## After"
	masked := textfacts.MaskPrefix + "bash command=\"make\"; 90 tokens, 4 lines hidden; last error: make: *** [all] Error 2. Run the call again to see it.]"
	failed := func(id, out string) schema.Message {
		m := resultMsg(id, out)
		m.Content.Blocks[0].IsError = true
		return m
	}
	msgs := []schema.Message{
		{Turn: schema.Turn{Role: schema.RoleUser, Content: schema.TextContent(earlier)}, IsSummary: true, CondenseID: "c0"},
		textMsg(schema.RoleUser, "Fix the build, then rerun the tests in tests/test_a.py please."),
		callMsg(schema.Block{Type: schema.BlockText, Text: "Looking at the sources first: the failure names a.py and b/c.go."},
			use("1", "bash", `{"command":["cat a.py","cat b/c.go > out.txt"],"cmd":"ls src/","script":"tee -a log/s.txt"}`)),
		failed("1", "<returncode>2</returncode>\n<output>\nTraceback (most recent call last):\n  File \"x.py\", line 1\n    raise ValueError(x)\nValueError: bad <b>token</b>\n</output>"),
		callMsg(use("2", "str_replace_editor", `{"path":["src/a.py","./src/b.py",""],"file_path":"docs/x.md","command":"str_replace"}`)),
		failed("2", masked),
		{Turn: schema.Turn{Role: schema.RoleUser, Content: schema.BlockContent(
			schema.Block{Type: schema.BlockText, Text: "[Sliding window truncation: 2 messages hidden to reduce context]"},
			use("9", "bash", `{"command":"tee -a log/x.txt < in.md"}`))}, IsTruncationMarker: true, TruncationID: "t0"},
		callMsg(use("3", "Write", `{"file_path":"new/file.ts","content":"x"}`), use("4", "bash", `{"command": "cat z.py"`),
			use("5", "bash", `["a.py"]`), use("6", "bash", `{"command":"sed -i 's/a/b/' q.go && echo ok >> q.log:3"}`),
			use("7", "run", `{"script":"python3 - <<EOF\nprint(open('zz.py'))\nEOF\ncat after.py","cmd":["x.go","y.go"],"files":["f/g.h",3]}`),
			use("8", "", `{}`)),
		failed("3", "FAILED tests/test_a.py::test_x - AssertionError\n<returncode> -1 </returncode>"),
		resultMsg("7", "ok"),
		textMsg(schema.RoleUser, "Now also update the README.md with the new flag."),
		textMsg(schema.RoleUser, prompts.FinalInstruction),
	}
	h := sha256.New()
	for _, limit := range []int{0, 900} {
		sum, err := (&Offline{MaxChars: limit}).Summarize(context.Background(), schema.SummaryRequest{Prompt: prompts.Detailed, Messages: msgs})
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(h, "%d\n%s\n", len(sum.Text), sum.Text)
	}
	fmt.Fprintf(h, "%s\n", textfacts.RenderFilesTouched(textfacts.FilesTouched(msgs)))
	return "synthetic 3 " + hex.EncodeToString(h.Sum(nil))
}

var updateGolden = flag.Bool("update", false, "rewrite testdata/offline_chain.golden from the current output")

// goldenFile holds, per run, a SHA-256 of every offline summary of its
// condenseChain and of the summary of the whole run at once, written before
// the extraction was rewritten: the whole summaries (counts, orders, lists,
// errors) must come out byte-identical.
const goldenFile = "testdata/offline_chain.golden"

func TestOfflineChainGolden(t *testing.T) {
	var got []string
	for _, r := range transcripts.Runs(t, transcriptDir) {
		h := sha256.New()
		texts := condenseChain(t, r.Messages)
		whole, err := (&Offline{}).Summarize(context.Background(), schema.SummaryRequest{Prompt: prompts.Detailed, Messages: r.Messages})
		if err != nil {
			t.Fatal(err)
		}
		texts = append(texts, whole.Text)
		for _, s := range texts {
			fmt.Fprintf(h, "%d\n%s\n", len(s), s)
		}
		got = append(got, fmt.Sprintf("%s %d %s", r.Name, len(texts), hex.EncodeToString(h.Sum(nil))))
	}
	got = append(got, syntheticGolden(t))
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
