//go:build race

package o200k

// raceEnabled trims the corpus comparison under the race detector, which
// slows the reference tokenizer down by an order of magnitude.
const raceEnabled = true
