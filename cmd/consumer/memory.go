package main

import (
	"fmt"
	"math"
	"os"
	"runtime/debug"
)

// memoryHeadroom is what the Go heap may hold beyond the fetched payloads
// (--max-held-bytes) before the collector works harder: the copies of the
// inputs a commit round is applying (their decoded text, stored bodies and
// changelog records; a round carries at most 16 MiB of payloads, or one
// larger input), the 64 MiB message cache, and the rest of the process.
const memoryHeadroom = 256 << 20

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
		return math.MaxInt64, "--memory-limit (none)"
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
