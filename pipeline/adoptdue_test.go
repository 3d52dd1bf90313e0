package pipeline

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
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

// A partition's unacked inputs are adopted only when this instance pulls
// it, inputs are delivered and unacked, and nobody holds the pin.
func TestOrphanedSpan(t *testing.T) {
	info := func(pending int, floor, delivered uint64, pinned string) *jetstream.ConsumerInfo {
		return &jetstream.ConsumerInfo{NumAckPending: pending,
			AckFloor:       jetstream.SequenceInfo{Stream: floor},
			Delivered:      jetstream.SequenceInfo{Stream: delivered},
			PriorityGroups: []jetstream.PriorityGroupState{{Group: PriorityGroup, PinnedClientID: pinned}}}
	}
	tests := []struct {
		name    string
		info    *jetstream.ConsumerInfo
		pulling bool
		want    [2]uint64
		ok      bool
	}{
		{"unacked and unpinned", info(2, 10, 12, ""), true, [2]uint64{10, 12}, true},
		{"a pin holds them", info(2, 10, 12, "abc"), true, [2]uint64{}, false},
		{"not pulled here", info(2, 10, 12, ""), false, [2]uint64{}, false},
		{"nothing pending", info(0, 10, 12, ""), true, [2]uint64{}, false},
		{"nothing delivered past the floor", info(1, 12, 12, ""), true, [2]uint64{}, false},
		{"no priority group state", &jetstream.ConsumerInfo{NumAckPending: 1, AckFloor: jetstream.SequenceInfo{Stream: 3}, Delivered: jetstream.SequenceInfo{Stream: 4}}, true, [2]uint64{3, 4}, true},
	}
	for _, tt := range tests {
		got, ok := orphanedSpan(tt.info, tt.pulling)
		if got != tt.want || ok != tt.ok {
			t.Errorf("%s: orphanedSpan = %v, %v; want %v, %v", tt.name, got, ok, tt.want, tt.ok)
		}
	}
}
