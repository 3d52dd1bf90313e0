package o200k

import (
	"fmt"
	"sync"

	tiktoken_loader "github.com/pkoukk/tiktoken-go-loader"
)

// rankFile is the name under which the loader's embedded assets hold the
// o200k_base merge ranks. The loader takes the base name of a URL, so the bare
// file name selects the same asset without implying a download.
const rankFile = "o200k_base.tiktoken"

// expectedRanks is the number of mergeable tokens in o200k_base (ids 0..199997).
// A different count means the embedded file is not the one this package was
// verified against.
const expectedRanks = 199998

// vocab is the immutable, shared view of the o200k_base ranks.
type vocab struct {
	byteRank [256]uint32       // id of every single-byte token
	pair2    []uint32          // id of two-byte tokens indexed by b0 | b1<<8, else noRank
	short    *shortTable       // tokens of 3..shortMax bytes
	long     map[string]uint32 // tokens longer than shortMax
	maxLen   int               // longest token in bytes; longer strings are never one token
}

var (
	vocabOnce sync.Once
	vocabVal  *vocab
	vocabErr  error
)

// loadVocab parses the embedded ranks once. It also builds the BMP class
// table, so everything the hot path reads is ready before the first Encoder
// exists.
func loadVocab() (*vocab, error) {
	vocabOnce.Do(func() {
		buildClassTable()
		vocabVal, vocabErr = parseVocab()
	})
	return vocabVal, vocabErr
}

func parseVocab() (*vocab, error) {
	ranks, err := tiktoken_loader.NewOfflineLoader().LoadTiktokenBpe(rankFile)
	if err != nil {
		return nil, fmt.Errorf("o200k: loading embedded ranks: %w", err)
	}
	if len(ranks) != expectedRanks {
		return nil, fmt.Errorf("o200k: embedded ranks hold %d tokens, want %d", len(ranks), expectedRanks)
	}
	v := &vocab{pair2: make([]uint32, 1<<16), long: make(map[string]uint32)}
	for i := range v.pair2 {
		v.pair2[i] = noRank
	}
	nShort := 0
	for tok := range ranks {
		if len(tok) > 2 && len(tok) <= shortMax {
			nShort++
		}
	}
	v.short = newShortTable(nShort)
	seen := make([]bool, len(ranks))
	for tok, id := range ranks {
		if id < 0 || id >= len(ranks) || id >= 1<<24 || seen[id] || tok == "" {
			return nil, fmt.Errorf("o200k: embedded ranks: bad or duplicate id %d", id)
		}
		seen[id] = true
		v.maxLen = max(v.maxLen, len(tok))
		switch n := len(tok); {
		case n == 1:
			// filled below, with a check that all 256 are present
		case n == 2:
			v.pair2[uint16(tok[0])|uint16(tok[1])<<8] = uint32(id)
		case n <= shortMax:
			v.short.put(pack(tok, 0, n), n, uint32(id))
		default:
			v.long[tok] = uint32(id)
		}
	}
	// Byte-level BPE needs every byte to be a token; otherwise some inputs
	// could not be encoded at all.
	for b := 0; b < 256; b++ {
		id, ok := ranks[string([]byte{byte(b)})]
		if !ok {
			return nil, fmt.Errorf("o200k: embedded ranks lack the single byte %#02x", b)
		}
		v.byteRank[b] = uint32(id)
	}
	return v, nil
}
