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
	ranks    map[string]int // token bytes -> token id
	byteRank [256]uint32    // id of every single-byte token
	maxLen   int            // longest token in bytes; longer pieces are never one token
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
	v := &vocab{ranks: ranks}
	seen := make([]bool, len(ranks))
	for tok, id := range ranks {
		if id < 0 || id >= len(ranks) || seen[id] {
			return nil, fmt.Errorf("o200k: embedded ranks: bad or duplicate id %d", id)
		}
		seen[id] = true
		if len(tok) > v.maxLen {
			v.maxLen = len(tok)
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
