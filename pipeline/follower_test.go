package pipeline

import "testing"

// A gained partition is followed from after the store's last record of it
// when the log holds more of it; a store that holds its last message has
// it current, followed from the log's end.
func TestRestoreFrom(t *testing.T) {
	tests := []struct {
		name               string
		last, applied, end uint64
		start              uint64
		current            bool
	}{
		{"never written", 0, 0, 40, 41, true},
		{"the store holds its last record", 17, 17, 40, 41, true},
		{"the store is ahead of what was read", 17, 20, 40, 41, true},
		{"the store lacks its last records", 30, 17, 40, 18, false},
		{"the store holds nothing of it", 30, 0, 40, 1, false},
	}
	for _, tt := range tests {
		start, current := restoreFrom(tt.last, tt.applied, tt.end)
		if start != tt.start || current != tt.current {
			t.Errorf("%s: restoreFrom = %d, %v; want %d, %v", tt.name, start, current, tt.start, tt.current)
		}
	}
}
