package tokens

import (
	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/tokens/o200k"
)

// O200K returns the exact o200k_base text counter (tokens/o200k: the same
// counts as OpenAI's tiktoken, several times faster). Its BPE ranks are
// embedded in the binary: nothing is downloaded at run time.
func O200K() (TextCounter, error) {
	return o200k.Default(), nil
}

// ForProfile returns the counter a profile asks for: exact o200k_base (the
// default) or the character heuristic, with the profile's fudge factor.
func ForProfile(p *schema.Profile) (Counter, error) {
	if p.Counter == schema.CounterChars {
		return Counter{Text: Chars{}, Fudge: p.Fudge()}, nil
	}
	tc, err := O200K()
	if err != nil {
		return Counter{}, err
	}
	return Counter{Text: tc, Fudge: p.Fudge()}, nil
}
