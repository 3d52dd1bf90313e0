// Package o200k counts and encodes tokens of OpenAI's o200k_base encoding
// (GPT-4o, GPT-4.1, o-series) exactly, and several times faster than a
// general-purpose tiktoken port.
//
// Exactness is defined against github.com/pkoukk/tiktoken-go encoding with no
// special tokens allowed: Encode(text, nil, nil). Special-token literals such
// as "<|endoftext|>" are therefore tokenized as ordinary text, and invalid
// UTF-8 is handled the way that library handles it: every byte that is not
// part of a valid UTF-8 sequence is replaced by U+FFFD before tokenizing
// (Go's []rune conversion). Unicode character classes come from the standard
// library's unicode tables, which are also the tables the reference regexp
// engine (regexp2) uses, so the two always agree on what a letter, number,
// mark or space is. (OpenAI's own tiktoken uses the Rust regex crate's
// tables; for the few characters whose category changed after Unicode 15.0,
// Go's version at the time of writing, both Go implementations may split
// differently from it.)
//
// UpperBound gives a safe bound without tokenizing, for budget checks that
// can avoid the exact count.
//
// The design has three parts, each removing one cost of the reference:
//
// Scanner. The o200k pre-tokenizer is a regular expression with a negative
// look-ahead (\s+(?!\S)) that Go's regexp package cannot express, so the
// reference runs it on a backtracking engine over a []rune copy of the text.
// Here the pattern is implemented by hand (scan.go): each alternative is a
// small function that reproduces what the backtracking engine would return,
// including alternation order and the places where a greedy quantifier has to
// give back characters. Character classes are looked up in a 128-entry ASCII
// table or a 64 KiB table for the Basic Multilingual Plane that is built once
// from the unicode package; only supplementary-plane runes query the unicode
// range tables directly. The scanner works on the string in place and never
// allocates.
//
// Cache. Pieces that are themselves a token cost one table lookup and never
// reach the merge loop. The remaining pieces (rarer words, CJK runs, long
// identifiers) are remembered in a fixed-size, two-way set-associative cache
// of immutable entries published through atomic pointers (cache.go). Its
// memory is bounded by construction: a fixed number of slots, each holding at
// most one entry whose key is at most maxCachedPiece bytes, with random
// eviction when a set is full. Readers take no lock, so many goroutines can
// share one Encoder.
//
// Merge. Byte-pair merging (bpe.go) follows tiktoken's rule: repeatedly merge
// the adjacent pair whose concatenation has the lowest rank, the leftmost one
// on ties. Pieces of up to 16 bytes use a linear scan over stack arrays;
// longer ones use a min-heap over a linked list, in pooled buffers, so that
// CJK runs are cheaper and adversarial input (a 10 000-letter word) stays
// O(n log n) rather than quadratic. Rank lookups (table.go) avoid a general
// string map for the common short strings: two-byte strings index an array,
// strings of up to eight bytes are packed into a uint64 and probed in an
// open-addressing table behind a Bloom filter (most lookups during a merge
// are for pairs that are not tokens), and only longer ones use a map, indexed
// with a substring so that nothing allocates.
//
// The ranks come from the o200k_base.tiktoken file embedded in
// github.com/pkoukk/tiktoken-go-loader; nothing is downloaded at run time. They
// are parsed once, on first use, and shared by every Encoder.
package o200k
