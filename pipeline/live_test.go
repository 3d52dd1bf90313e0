package pipeline

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// The live list: refreshed within liveWithin and not catching up; the
// watch is trusted only while it shows this instance's own refreshes.
func TestLiveFromTheWatch(t *testing.T) {
	now := time.Unix(1000, 0)
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	tests := []struct {
		name  string
		seen  map[string]lockSeen
		want  []string
		stale string // watchCurrent's error contains it; "" for none
	}{
		{
			name: "fresh ones, sorted",
			seen: map[string]lockSeen{"b": {at: ago(time.Second)}, "a": {at: ago(0)}, "self": {at: ago(500 * time.Millisecond)}},
			want: []string{"a", "b", "self"},
		},
		{
			name: "a silent one drops out at once, long before its lock lapses",
			seen: map[string]lockSeen{"dead": {at: ago(liveWithin + time.Millisecond)}, "self": {at: ago(0)}},
			want: []string{"self"},
		},
		{
			name: "exactly liveWithin is still live",
			seen: map[string]lockSeen{"edge": {at: ago(liveWithin)}, "self": {at: ago(0)}},
			want: []string{"edge", "self"},
		},
		{
			name: "catching up: holds its name, owns nothing",
			seen: map[string]lockSeen{"late": {at: ago(0), catchingUp: true}, "self": {at: ago(0)}},
			want: []string{"self"},
		},
		{
			name:  "this instance catching up itself: the watch is current all the same",
			seen:  map[string]lockSeen{"other": {at: ago(0)}, "self": {at: ago(0), catchingUp: true}},
			want:  []string{"other"},
			stale: "",
		},
		{
			name:  "the watch stopped delivering: everyone looks dead, so it is not believed",
			seen:  map[string]lockSeen{"other": {at: ago(5 * time.Second)}, "self": {at: ago(5 * time.Second)}},
			want:  nil,
			stale: "refreshed 5s ago",
		},
		{
			name:  "this instance's lock not seen yet",
			seen:  map[string]lockSeen{"other": {at: ago(0)}},
			want:  []string{"other"},
			stale: "has not shown",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := liveAt(tt.seen, now); !slices.Equal(got, tt.want) {
				t.Errorf("liveAt = %v, want %v", got, tt.want)
			}
			err := watchCurrent(tt.seen, "self", now)
			switch {
			case tt.stale == "" && err != nil:
				t.Errorf("watchCurrent: %v, want current", err)
			case tt.stale != "" && (err == nil || !strings.Contains(err.Error(), tt.stale)):
				t.Errorf("watchCurrent: %v, want an error with %q", err, tt.stale)
			}
		})
	}
}
