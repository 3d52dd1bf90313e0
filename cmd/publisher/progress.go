package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"time"
)

// progress writes a progress line to stderr: rewritten in place with \r on
// a terminal, otherwise a new line every logEvery turns or every 2 s, so
// that logs stay readable.
type progress struct {
	w     io.Writer
	verb  string
	total int
	tty   bool
	start time.Time
	last  time.Time
	lastN int
	wrote bool
}

const logEvery = 1000

func newProgress(w io.Writer, verb string, total int) *progress {
	tty := false
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			tty = true
		}
	}
	now := time.Now()
	return &progress{w: w, verb: verb, total: total, tty: tty, start: now, last: now}
}

func (p *progress) update(n, bytes, dups int) {
	if p == nil {
		return
	}
	now := time.Now()
	if p.tty {
		if now.Sub(p.last) < 100*time.Millisecond && n != p.total {
			return
		}
	} else if n-p.lastN < logEvery && now.Sub(p.last) < 2*time.Second {
		return
	}
	p.last, p.lastN = now, n
	secs := max(now.Sub(p.start).Seconds(), 1e-9)
	line := fmt.Sprintf("%s %s/%s turns  %s  %s turns/s  %s dup",
		p.verb, thousands(n), thousands(p.total), mb(bytes), thousands(int(float64(n)/secs)), thousands(dups))
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K%s", line)
		p.wrote = true
	} else {
		fmt.Fprintln(p.w, line)
	}
}

// finish ends a rewritten line so the summary starts on its own.
func (p *progress) finish() {
	if p != nil && p.tty && p.wrote {
		fmt.Fprintln(p.w)
	}
}

// thousands formats n with comma separators: 182304 → 182,304.
func thousands(n int) string {
	s := strconv.Itoa(n)
	neg := n < 0
	if neg {
		s = s[1:]
	}
	out := make([]byte, 0, len(s)+len(s)/3)
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}

func mb(n int) string {
	switch {
	case n >= 1e6:
		return fmt.Sprintf("%.2f MB", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1f kB", float64(n)/1e3)
	}
	return fmt.Sprintf("%d B", n)
}
