package pipeline

import (
	"fmt"
	"testing"
	"time"
)

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

// The progress line tells a run that handed nothing over from one waiting
// to hand an item over, and counts what it handed.
func TestFollowerProgress(t *testing.T) {
	f := &follower{}
	line := func() string { return fmt.Sprint(f.progress()...) }
	if got := line(); got != fmt.Sprint("run_began", "none", "items_handed", uint64(0), "last_handed", "never", "handing_for", "not handing") {
		t.Errorf("before any run: %s", got)
	}
	f.prog.start()
	f.prog.sent.Add(2)
	f.prog.lastSent.Store(time.Now().Add(-time.Second).UnixNano())
	f.prog.handing.Store(time.Now().Add(-3 * time.Second).UnixNano())
	attrs := f.progress()
	want := map[string]func(any) bool{
		"items_handed": func(v any) bool { return v == uint64(2) },
		"last_handed":  func(v any) bool { d, err := time.ParseDuration(v.(string)); return err == nil && d >= time.Second },
		"handing_for":  func(v any) bool { d, err := time.ParseDuration(v.(string)); return err == nil && d >= 3*time.Second },
		"run_began":    func(v any) bool { _, err := time.ParseDuration(v.(string)); return err == nil },
	}
	for i := 0; i+1 < len(attrs); i += 2 {
		if ok := want[attrs[i].(string)]; ok == nil || !ok(attrs[i+1]) {
			t.Errorf("%v = %v", attrs[i], attrs[i+1])
		}
	}
	// A new run starts from nothing.
	f.prog.start()
	if got := fmt.Sprint(f.progress()[2:]...); got != fmt.Sprint("items_handed", uint64(0), "last_handed", "never", "handing_for", "not handing") {
		t.Errorf("a new run: %s", got)
	}
}
