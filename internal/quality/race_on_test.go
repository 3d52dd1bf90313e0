//go:build race

package quality

// raceEnabled trims the replay of every shared run to a few under the race
// detector, which makes the whole replay take minutes.
const raceEnabled = true
