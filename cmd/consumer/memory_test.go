package main

import (
	"math"
	"strings"
	"testing"
)

func TestMemoryLimit(t *testing.T) {
	held := DefaultConfig().Pipeline.MaxHeldBytes
	tests := []struct {
		name     string
		flag     int64
		held     int
		env      string
		want     int64
		wantFrom string
	}{
		{"derived from the held bound", 0, held, "", int64(held) + 256<<20, "--max-held-bytes + 256 MiB"},
		{"a smaller held bound lowers it", 0, 64 << 20, "", 320 << 20, "--max-held-bytes + 256 MiB"},
		{"GOMEMLIMIT is left to the runtime", 0, held, "300MiB", 0, "GOMEMLIMIT"},
		{"the flag wins over GOMEMLIMIT", 400 << 20, held, "300MiB", 400 << 20, "--memory-limit"},
		{"off sets none", -1, held, "", math.MaxInt64, "--memory-limit off"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			c.MemoryLimit, c.Pipeline.MaxHeldBytes = tt.flag, tt.held
			got, from := memoryLimit(c, func(k string) string {
				if k == "GOMEMLIMIT" {
					return tt.env
				}
				return ""
			})
			if got != tt.want || from != tt.wantFrom {
				t.Fatalf("memoryLimit = %d (%s), want %d (%s)", got, from, tt.want, tt.wantFrom)
			}
		})
	}
}

// --memory-limit is written as GOMEMLIMIT is; a typo or a forgotten unit
// is refused at start rather than run under.
func TestMemoryLimitFlag(t *testing.T) {
	for _, tt := range []struct {
		arg  string
		want int64
		bad  string
	}{
		{"", 0, ""},
		{"off", -1, ""},
		{"512MiB", 512 << 20, ""},
		{"2GiB", 2 << 30, ""},
		{"1TiB", 1 << 40, ""},
		{"70000KiB", 70000 << 10, ""},
		{"134217728", 128 << 20, ""},
		{"134217728B", 128 << 20, ""},
		{"512", 0, "too little to run in"},
		{"63MiB", 0, "too little to run in"},
		{"-1", 0, "want a size"},
		{"-5MiB", 0, "want a size"},
		{"1.5GiB", 0, "want a size"},
		{"512MB", 0, "want a size"},
		{"lots", 0, "want a size"},
		{"9999999TiB", 0, "too large"},
		{"99999999999999999999", 0, "want a size"},
	} {
		m := NewMain()
		err := m.ParseFlags([]string{"--memory-limit", tt.arg})
		switch {
		case tt.bad != "" && (err == nil || !strings.Contains(err.Error(), tt.bad)):
			t.Errorf("--memory-limit %q: err %v, want %q", tt.arg, err, tt.bad)
		case tt.bad == "" && err != nil:
			t.Errorf("--memory-limit %q: %v", tt.arg, err)
		case tt.bad == "" && m.Config.MemoryLimit != tt.want:
			t.Errorf("--memory-limit %q = %d, want %d", tt.arg, m.Config.MemoryLimit, tt.want)
		}
	}
}
