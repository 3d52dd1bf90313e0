package tokens

import (
	"fmt"
	"sync"

	tiktoken "github.com/pkoukk/tiktoken-go"
	tiktokenloader "github.com/pkoukk/tiktoken-go-loader"

	"github.com/ctxpipe/ctxpipe/schema"
)

var (
	exactOnce sync.Once
	exact     TextCounter
	exactErr  error
)

type tiktokenCounter struct{ enc *tiktoken.Tiktoken }

func (t tiktokenCounter) Count(s string) int { return len(t.enc.Encode(s, nil, nil)) }

// O200K returns the exact o200k_base text counter. The BPE ranks are embedded
// in the binary (offline loader): nothing is downloaded at run time.
func O200K() (TextCounter, error) {
	exactOnce.Do(func() {
		tiktoken.SetBpeLoader(tiktokenloader.NewOfflineLoader())
		enc, err := tiktoken.GetEncoding(tiktoken.MODEL_O200K_BASE)
		if err != nil {
			exactErr = fmt.Errorf("load o200k_base: %w", err)
			return
		}
		exact = tiktokenCounter{enc}
	})
	return exact, exactErr
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
