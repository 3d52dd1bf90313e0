package pipeline

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"sync"
	"time"
)

// Metrics are the runner's counters, served in the Prometheus text format.
// A nil *Metrics is valid and records nothing, so tests need not set one up.
type Metrics struct {
	mu       sync.Mutex
	counters map[string]map[string]float64 // name → label set → value
	help     map[string]string
	gauges   map[string]func(context.Context) (float64, error)
}

// NewMetrics returns an empty registry.
func NewMetrics() *Metrics {
	return &Metrics{
		counters: map[string]map[string]float64{},
		help:     map[string]string{},
		gauges:   map[string]func(context.Context) (float64, error){},
	}
}

// Add increases counter name{labels} by v. labels is `key="value",...` or "".
func (m *Metrics) Add(name, labels string, v float64) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.counters[name]
	if c == nil {
		c = map[string]float64{}
		m.counters[name] = c
	}
	c[labels] += v
}

// Inc adds one.
func (m *Metrics) Inc(name, labels string) { m.Add(name, labels, 1) }

// Observe records a duration as a Prometheus summary without quantiles
// (name_sum and name_count), which is enough for rates and averages.
func (m *Metrics) Observe(name, labels string, d time.Duration) {
	m.Add(name+"_sum", labels, d.Seconds())
	m.Add(name+"_count", labels, 1)
}

// Help documents a metric.
func (m *Metrics) Help(name, text string) {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.help[name] = text
	m.mu.Unlock()
}

// Gauge registers a value read at scrape time.
func (m *Metrics) Gauge(name, help string, f func(context.Context) (float64, error)) {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.gauges[name] = f
	m.help[name] = help
	m.mu.Unlock()
}

// Value returns a counter's value (for tests and the bench command).
func (m *Metrics) Value(name, labels string) float64 {
	if m == nil {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.counters[name][labels]
}

// WriteTo writes every metric in the Prometheus text exposition format.
func (m *Metrics) WriteTo(ctx context.Context, w io.Writer) error {
	m.mu.Lock()
	names := make([]string, 0, len(m.counters))
	for n := range m.counters {
		names = append(names, n)
	}
	sort.Strings(names)
	type line struct {
		name, labels string
		v            float64
	}
	var lines []line
	for _, n := range names {
		keys := make([]string, 0, len(m.counters[n]))
		for k := range m.counters[n] {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			lines = append(lines, line{n, k, m.counters[n][k]})
		}
	}
	gnames := make([]string, 0, len(m.gauges))
	for n := range m.gauges {
		gnames = append(gnames, n)
	}
	sort.Strings(gnames)
	gauges := make([]func(context.Context) (float64, error), len(gnames))
	for i, n := range gnames {
		gauges[i] = m.gauges[n]
	}
	help := make(map[string]string, len(m.help))
	for k, v := range m.help {
		help[k] = v
	}
	m.mu.Unlock()

	last := ""
	for _, l := range lines {
		if l.name != last {
			if h := help[l.name]; h != "" {
				fmt.Fprintf(w, "# HELP %s %s\n", l.name, h)
			}
			fmt.Fprintf(w, "# TYPE %s counter\n", l.name)
			last = l.name
		}
		if l.labels == "" {
			fmt.Fprintf(w, "%s %g\n", l.name, l.v)
		} else {
			fmt.Fprintf(w, "%s{%s} %g\n", l.name, l.labels, l.v)
		}
	}
	for i, n := range gnames {
		v, err := gauges[i](ctx)
		if err != nil {
			continue // a failed read leaves the gauge out of this scrape
		}
		if h := help[n]; h != "" {
			fmt.Fprintf(w, "# HELP %s %s\n", n, h)
		}
		fmt.Fprintf(w, "# TYPE %s gauge\n%s %g\n", n, n, v)
	}
	return nil
}

// Handler serves /metrics.
func (m *Metrics) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_ = m.WriteTo(r.Context(), w)
	})
}
