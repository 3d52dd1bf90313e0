package main

import (
	"math"
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
		{"-1 sets none", -1, held, "", math.MaxInt64, "--memory-limit (none)"},
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

func TestMemoryLimitFlag(t *testing.T) {
	m := NewMain()
	if err := m.ParseFlags([]string{"--memory-limit", "123456789"}); err != nil {
		t.Fatal(err)
	}
	if m.Config.MemoryLimit != 123456789 {
		t.Fatalf("--memory-limit parsed as %d", m.Config.MemoryLimit)
	}
}
