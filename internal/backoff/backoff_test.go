package backoff

import (
	"context"
	"errors"
	"testing"
	"time"
)

const ms = time.Millisecond

func TestStep(t *testing.T) {
	cases := []struct {
		name string
		p    Policy
		n    int
		want time.Duration
	}{
		{"the first retry", Policy{First: 250 * ms, Max: 10 * time.Second}, 1, 250 * ms},
		{"the second doubles", Policy{First: 250 * ms, Max: 10 * time.Second}, 2, 500 * ms},
		{"the sixth", Policy{First: 250 * ms, Max: 10 * time.Second}, 6, 8 * time.Second},
		{"capped", Policy{First: 250 * ms, Max: 10 * time.Second}, 7, 10 * time.Second},
		{"far past the cap", Policy{First: 250 * ms, Max: 10 * time.Second}, 1000, 10 * time.Second},
		{"a cap that is no power of two times First", Policy{First: 50 * ms, Max: time.Second}, 6, time.Second},
		{"a cap under First", Policy{First: time.Second, Max: 100 * ms}, 1, 100 * ms},
		{"a retry number under 1 is the first", Policy{First: 100 * ms, Max: time.Second}, 0, 100 * ms},
		{"no wait", Policy{}, 5, 0},
	}
	for _, c := range cases {
		if got := c.p.Step(c.n); got != c.want {
			t.Errorf("%s: Step(%d) = %v, want %v", c.name, c.n, got, c.want)
		}
		if c.p.Jitter {
			continue
		}
		if got := c.p.Wait(c.n); got != c.want {
			t.Errorf("%s: Wait(%d) without jitter = %v, want the step %v", c.name, c.n, got, c.want)
		}
	}
}

// A jittered wait lies in the upper half of its step, ends included, and
// varies.
func TestWaitJitter(t *testing.T) {
	p := Policy{First: 100 * ms, Max: 400 * ms, Jitter: true}
	for n := 1; n <= 5; n++ {
		step := p.Step(n)
		seen := map[time.Duration]bool{}
		for range 200 {
			d := p.Wait(n)
			if d < step/2 || d > step {
				t.Fatalf("Wait(%d) = %v, outside [%v, %v]", n, d, step/2, step)
			}
			seen[d] = true
		}
		if len(seen) < 2 {
			t.Errorf("Wait(%d) drew %v every time: no jitter", n, seen)
		}
	}
	if d := (Policy{Jitter: true}).Wait(3); d != 0 {
		t.Errorf("a zero policy waits %v", d)
	}
}

func TestBackoffWalksThePolicy(t *testing.T) {
	b := New(Policy{First: 50 * ms, Max: 300 * ms})
	var got []time.Duration
	for range 5 {
		got = append(got, b.Next())
	}
	want := []time.Duration{50 * ms, 100 * ms, 200 * ms, 300 * ms, 300 * ms}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("waits %v, want %v", got, want)
		}
	}
	b.Reset()
	if d := b.Next(); d != 50*ms {
		t.Errorf("after Reset the wait is %v, want the first, 50ms", d)
	}
}

func TestSleep(t *testing.T) {
	if err := Sleep(context.Background(), ms); err != nil {
		t.Errorf("a wait that runs out: %v", err)
	}
	if err := Sleep(context.Background(), 0); err != nil {
		t.Errorf("no wait, ctx alive: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Sleep(ctx, 0); !errors.Is(err, context.Canceled) {
		t.Errorf("no wait, ctx done: %v, want context.Canceled", err)
	}
	start := time.Now()
	if err := Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Errorf("a wait cut by ctx: %v, want context.Canceled", err)
	}
	if time.Since(start) > time.Minute {
		t.Error("Sleep waited on after ctx was done")
	}
}
