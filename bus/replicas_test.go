package bus

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/internal/natstest"
)

// TestEnsureKeepsOperatorSettings runs against a real 3-node cluster: an
// operator's R3 streams and bucket must survive a start asking for fewer
// replicas, with their limits, while ctxpipe still sets what it owns and
// raises replicas when asked for more.
func TestEnsureKeepsOperatorSettings(t *testing.T) {
	c := natstest.RunCluster(t)
	js, err := jetstream.New(natstest.Connect(t, c.URL()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	type want struct {
		replicas int
		maxAge   time.Duration
		history  int64 // of the bucket
	}
	tests := []struct {
		name     string
		operator func(t *testing.T) // what exists before ctxpipe starts
		opts     []Option
		in, ev   want
		bucket   want
		logs     []string // lines the logger must have received
	}{
		{
			name: "operator R3 with a max age, ctxpipe asks R1",
			operator: func(t *testing.T) {
				cfg := InStreamConfig(WithReplicas(3), WithMaxAge(time.Hour))
				cfg.Duplicates = time.Minute // not the operator's to choose
				mustCreateStream(ctx, t, js, cfg)
				if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: ProfilesBucket, History: 10, Replicas: 3}); err != nil {
					t.Fatal(err)
				}
			},
			opts:   []Option{WithReplicas(1)},
			in:     want{3, time.Hour, 0},
			ev:     want{1, 0, 0}, // missing: created as asked
			bucket: want{3, 0, 10},
			logs: []string{
				"level=WARN msg=\"stream CTX_IN has replicas 3, ctxpipe asks 1: keeping 3",
				"level=INFO msg=\"stream CTX_IN has max_age 1h0m0s, ctxpipe asks unlimited: keeping 1h0m0s",
				"level=INFO msg=\"stream CTX_IN duplicates was 1m0s, ctxpipe sets 2m0s\"",
				"level=WARN msg=\"bucket ctx_profiles has replicas 3, ctxpipe asks 1: keeping 3",
				"level=INFO msg=\"bucket ctx_profiles has history 10, ctxpipe asks 5: keeping 10",
			},
		},
		{
			name: "ctxpipe's R1, asked R3: raised",
			operator: func(t *testing.T) {
				if err := EnsureStreams(ctx, js); err != nil {
					t.Fatal(err)
				}
				if _, err := EnsureProfiles(ctx, js); err != nil {
					t.Fatal(err)
				}
			},
			opts:   []Option{WithReplicas(3)},
			in:     want{3, 0, 0},
			ev:     want{3, 0, 0},
			bucket: want{3, 0, ProfilesHistory},
			logs: []string{
				"level=INFO msg=\"stream CTX_IN replicas was 1, ctxpipe sets 3\"",
				"level=INFO msg=\"stream CTX_EVENTS replicas was 1, ctxpipe sets 3\"",
				"level=INFO msg=\"stream CTX_STATE replicas was 1, ctxpipe sets 3\"",
				"level=INFO msg=\"bucket ctx_profiles replicas was 1, ctxpipe sets 3\"",
			},
		},
		{
			name:     "nothing there: created as asked, nothing to report",
			operator: func(t *testing.T) {},
			opts:     []Option{WithReplicas(3)},
			in:       want{3, 0, 0},
			ev:       want{3, 0, 0},
			bucket:   want{3, 0, ProfilesHistory},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, name := range []string{StreamIn, StreamEvents, "KV_" + ProfilesBucket} {
				if err := js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
					t.Fatal(err)
				}
			}
			c.WaitPeers()
			tt.operator(t)
			var buf bytes.Buffer
			opts := append(tt.opts, WithLogger(slog.New(slog.NewTextHandler(&buf, nil))))
			if err := EnsureStreams(ctx, js, opts...); err != nil {
				t.Fatal(err)
			}
			kv, err := EnsureProfiles(ctx, js, opts...)
			if err != nil {
				t.Fatal(err)
			}
			// A bucket the operator just made may still be electing its
			// leader: usable means usable within a few seconds.
			for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				_, err := kv.Put(ctx, "p", []byte("{}"))
				if err == nil {
					break
				}
				if !Transient(err) || time.Now().After(deadline) {
					t.Fatalf("bucket not usable: %v", err)
				}
			}
			for _, s := range []struct {
				name string
				want want
			}{{StreamIn, tt.in}, {StreamEvents, tt.ev}, {"KV_" + ProfilesBucket, tt.bucket}} {
				st, err := js.Stream(ctx, s.name)
				if err != nil {
					t.Fatal(err)
				}
				cfg := st.CachedInfo().Config
				if cfg.Replicas != s.want.replicas || cfg.MaxAge != s.want.maxAge {
					t.Errorf("%s: replicas %d max age %v, want %d and %v", s.name, cfg.Replicas, cfg.MaxAge, s.want.replicas, s.want.maxAge)
				}
				if s.want.history != 0 && cfg.MaxMsgsPerSubject != s.want.history {
					t.Errorf("%s: history %d, want %d", s.name, cfg.MaxMsgsPerSubject, s.want.history)
				}
				if s.name != "KV_"+ProfilesBucket && (cfg.Duplicates != DuplicateWindow || cfg.MaxMsgSize != MaxMsgSize) {
					t.Errorf("%s: duplicates %v max msg size %d, want ctxpipe's", s.name, cfg.Duplicates, cfg.MaxMsgSize)
				}
			}
			logged := buf.String()
			for _, l := range tt.logs {
				if !strings.Contains(logged, l) {
					t.Errorf("log lacks %q; it has:\n%s", l, logged)
				}
			}
			if n := strings.Count(logged, "\n"); n != len(tt.logs) {
				t.Errorf("logged %d lines, want %d:\n%s", n, len(tt.logs), logged)
			}
		})
	}
}

// mustCreateStream creates cfg's stream, as an operator would before
// ctxpipe starts. A cluster may drop an API request whose proposal it was making when its
// meta leader changed (under a loaded CI machine, once, create CTX_IN waited
// out the test's two minutes): each attempt has 15 s, and creating the same
// configuration again is not an error.
func mustCreateStream(ctx context.Context, t *testing.T, js jetstream.JetStream, cfg jetstream.StreamConfig) {
	t.Helper()
	for {
		actx, cancel := context.WithTimeout(ctx, 15*time.Second)
		_, err := js.CreateStream(actx, cfg)
		cancel()
		if err == nil {
			return
		}
		if ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("create %s: %v", cfg.Name, err)
		}
		t.Logf("create %s: %v; asking again", cfg.Name, err)
	}
}

// TestFindingDuplicatesFollowMaxAge: the server refuses a duplicate window
// longer than the max age, so an operator's short max age shortens it.
func TestFindingDuplicatesFollowMaxAge(t *testing.T) {
	if got := InStreamConfig(WithMaxAge(30 * time.Second)).Duplicates; got != 30*time.Second {
		t.Fatalf("duplicates = %v, want the 30s max age", got)
	}
	js, _ := newJS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mustCreateStream(ctx, t, js, InStreamConfig(WithMaxAge(30*time.Second)))
	if _, err := ReconcileStreams(ctx, js); err != nil {
		t.Fatalf("reconcile with a 30s max age: %v", err)
	}
}
