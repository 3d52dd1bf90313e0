package pipeline

import "testing"

// A partition iterator's term: the first delivery and any under another pin
// start a term (catch up, replay the unacked inputs); a gap in the
// consumer's numbering while pinned replays them too; otherwise the term
// goes on.
func TestTermOf(t *testing.T) {
	tests := []struct {
		name           string
		owning         bool
		term, pin      string
		last, delivery uint64
		want           termStep
	}{
		{"the first delivery", false, "", "pin-a", 0, 1, termStarts},
		{"the first delivery, no pin header", false, "", "", 0, 1, termStarts},
		{"the next delivery", true, "pin-a", "pin-a", 4, 5, termGoesOn},
		{"another pin", true, "pin-a", "pin-b", 4, 5, termStarts},
		{"another pin and a gap", true, "pin-a", "pin-b", 4, 9, termStarts},
		{"a delivery lost on the way", true, "pin-a", "pin-a", 4, 6, termResyncs},
		{"numbered back (a consumer leader change)", true, "pin-a", "pin-a", 4, 2, termResyncs},
		{"the same number again", true, "pin-a", "pin-a", 4, 4, termResyncs},
	}
	for _, tt := range tests {
		if got := termOf(tt.owning, tt.term, tt.pin, tt.last, tt.delivery); got != tt.want {
			t.Errorf("%s: termOf = %d, want %d", tt.name, got, tt.want)
		}
	}
}
