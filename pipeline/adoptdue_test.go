package pipeline

import (
	"testing"
	"time"
)

// The consumers are listed only while a silent owner may still hold
// inputs of a partition this instance pulls: one began pulling within the
// ack wait.
func TestAdoptDue(t *testing.T) {
	now := time.Unix(1000, 0)
	const ackWait = 30 * time.Second
	tests := []struct {
		name   string
		starts []time.Duration // how long ago each pulled partition began
		want   bool
	}{
		{"pulling nothing", nil, false},
		{"just gained one", []time.Duration{time.Second}, true},
		{"all pulled for longer than the ack wait", []time.Duration{time.Minute, ackWait}, false},
		{"one rebuilt lately among old ones", []time.Duration{time.Hour, 29 * time.Second}, true},
	}
	for _, tt := range tests {
		var starts []time.Time
		for _, d := range tt.starts {
			starts = append(starts, now.Add(-d))
		}
		if got := adoptDue(starts, now, ackWait); got != tt.want {
			t.Errorf("%s: adoptDue = %v, want %v", tt.name, got, tt.want)
		}
	}
}
