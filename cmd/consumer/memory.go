package main

import (
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// memoryHeadroom is what the Go heap may hold beyond the fetched payloads
// (--max-held-bytes) before the collector works harder: the copies of the
// inputs a commit round is applying (their decoded text, stored bodies and
// changelog records; a round carries at most 16 MiB of payloads, or one
// larger input), the 64 MiB message cache, and the rest of the process.
const memoryHeadroom = 256 << 20

// minMemoryLimit refuses a limit the service cannot run under: below it the
// collector would run without end (and "--memory-limit 512", meaning MiB,
// is 512 bytes).
const minMemoryLimit = 64 << 20

// parseMemoryLimit reads --memory-limit as GOMEMLIMIT is written: a byte
// count with an optional unit (B, KiB, MiB, GiB, TiB), or "off" for no
// limit. "" is 0: derived (memoryLimit). None is returned as -1.
func parseMemoryLimit(s string) (int64, error) {
	s = strings.TrimSpace(s)
	switch s {
	case "":
		return 0, nil
	case "off":
		return -1, nil
	}
	num, mult := s, int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"B", 1}} {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			num, mult = n, u.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("--memory-limit %q: want a size such as 512MiB or 2GiB (the units of GOMEMLIMIT), or off", s)
	}
	if n > math.MaxInt64/mult {
		return 0, fmt.Errorf("--memory-limit %q is too large", s)
	}
	if n*mult < minMemoryLimit {
		return 0, fmt.Errorf("--memory-limit %q is under %d MiB, too little to run in (a unit forgotten?)", s, minMemoryLimit>>20)
	}
	return n * mult, nil
}

// memoryLimit is the soft limit the service puts on the Go runtime
// (runtime/debug.SetMemoryLimit): asked (--memory-limit), else GOMEMLIMIT
// when the environment sets it (the runtime applied it already; 0 is
// returned), else --max-held-bytes plus memoryHeadroom. Without a limit Go
// lets the heap grow to twice what is live, and with 4 MiB inputs most of
// what is live is garbage a moment later: the held bound alone does not
// bound the process (docs/operations.md, 5.7).
func memoryLimit(c Config, env func(string) string) (limit int64, source string) {
	switch {
	case c.MemoryLimit > 0:
		return c.MemoryLimit, "--memory-limit"
	case c.MemoryLimit < 0:
		return math.MaxInt64, "--memory-limit off"
	case env("GOMEMLIMIT") != "":
		return 0, "GOMEMLIMIT"
	}
	return int64(c.Pipeline.MaxHeldBytes) + memoryHeadroom, "--max-held-bytes + 256 MiB"
}

// applyMemoryLimit sets the runtime's soft memory limit as memoryLimit
// says, and returns it as the runtime now has it, for the start log.
func applyMemoryLimit(c Config) (limit int64, source string) {
	limit, source = memoryLimit(c, os.Getenv)
	if limit > 0 {
		debug.SetMemoryLimit(limit)
	}
	return debug.SetMemoryLimit(-1), source
}

// mib formats a byte count for the log.
func mib(n int64) string {
	if n == math.MaxInt64 {
		return "none"
	}
	return fmt.Sprintf("%d MiB", n>>20)
}
