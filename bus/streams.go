// Package bus holds what the ctxpipe service and its clients share about
// NATS: the names and configurations of the streams, the consumer, the
// profiles bucket and the queue group; how to connect; and how to publish an
// input so that JetStream can drop duplicates.
package bus

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Names shared by the service, the clients and nats.conf.
const (
	// StreamIn holds every input (ctx.in.>): turns, condense, overflow, rewind.
	StreamIn = "CTX_IN"
	// StreamEvents holds every event ctxpipe announces (ctx.events.>).
	StreamEvents = "CTX_EVENTS"
	// ProfilesBucket is the JetStream KV bucket of profiles (key = profile id).
	ProfilesBucket = "ctx_profiles"
	// ConsumerName is the default durable pull consumer on StreamIn.
	ConsumerName = "ctxpipe"
	// QueueGroup is the queue group the query responders share, so that each
	// query is answered by one instance.
	QueueGroup = "ctxpipe"

	// InputSubjects and EventSubjects are the streams' subject filters.
	InputSubjects = "ctx.in.>"
	EventSubjects = "ctx.events.>"
	// QuerySubjects covers ctx.q.history and ctx.q.status.
	QuerySubjects = "ctx.q.>"

	// DuplicateWindow is how long JetStream remembers a Nats-Msg-Id. After
	// it, ctxpipe's own idempotency by input id takes over.
	DuplicateWindow = 2 * time.Minute
	// MaxMsgSize bounds one input or event. A turn carrying a large tool
	// result or a base64 image fits; the server's max_payload must be at
	// least this (nats.conf sets 8MB).
	MaxMsgSize = 8 << 20
	// ProfilesHistory is how many revisions of each profile the bucket keeps.
	ProfilesHistory = 5
)

// Option adjusts the stream and bucket configurations.
type Option func(*options)

type options struct {
	replicas int
	maxAge   time.Duration
	maxBytes int64
}

func buildOptions(opts []Option) options {
	o := options{replicas: 1, maxBytes: -1}
	for _, f := range opts {
		f(&o)
	}
	return o
}

// WithReplicas sets the replica count of both streams and the bucket: 1 (the
// default) for a single server, 3 for a cluster.
func WithReplicas(n int) Option {
	return func(o *options) {
		if n > 0 {
			o.replicas = n
		}
	}
}

// WithMaxAge bounds how long the streams keep messages (0 = for ever).
// SQLite holds the full history, so the streams only need to cover replay
// and recovery.
func WithMaxAge(d time.Duration) Option { return func(o *options) { o.maxAge = d } }

// WithMaxBytes bounds each stream's size (-1 = unlimited); old messages are
// discarded first.
func WithMaxBytes(n int64) Option { return func(o *options) { o.maxBytes = n } }

// InStreamConfig is the configuration of CTX_IN.
func InStreamConfig(opts ...Option) jetstream.StreamConfig {
	return streamConfig(StreamIn, "ctxpipe inputs: turns, condense, overflow and rewind requests", InputSubjects, opts)
}

// EventsStreamConfig is the configuration of CTX_EVENTS.
func EventsStreamConfig(opts ...Option) jetstream.StreamConfig {
	c := streamConfig(StreamEvents, "ctxpipe events: condense, truncation, rewind and rejection decisions", EventSubjects, opts)
	// Events are read far more than written: let any replica answer direct gets.
	c.AllowDirect = true
	return c
}

// streamConfig is what both streams share: file storage, limits retention
// discarding the oldest, the duplicate window and the message size bound.
func streamConfig(name, description, subjects string, opts []Option) jetstream.StreamConfig {
	o := buildOptions(opts)
	return jetstream.StreamConfig{
		Name:        name,
		Description: description,
		Subjects:    []string{subjects},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		Duplicates:  DuplicateWindow,
		MaxMsgSize:  MaxMsgSize,
		MaxAge:      o.maxAge,
		MaxBytes:    o.maxBytes,
		Replicas:    o.replicas,
	}
}

// ProfilesConfig is the configuration of the ctx_profiles bucket.
func ProfilesConfig(opts ...Option) jetstream.KeyValueConfig {
	o := buildOptions(opts)
	return jetstream.KeyValueConfig{
		Bucket:      ProfilesBucket,
		Description: "ctxpipe profiles: context window, thresholds, strategy, LLM",
		History:     ProfilesHistory,
		Storage:     jetstream.FileStorage,
		Replicas:    o.replicas,
	}
}

// EnsureStreams creates CTX_IN and CTX_EVENTS, or updates them to the
// configuration above when they exist.
func EnsureStreams(ctx context.Context, js jetstream.JetStream, opts ...Option) error {
	for _, cfg := range []jetstream.StreamConfig{InStreamConfig(opts...), EventsStreamConfig(opts...)} {
		if _, err := js.CreateOrUpdateStream(ctx, cfg); err != nil {
			return fmt.Errorf("ensure stream %s: %w", cfg.Name, err)
		}
	}
	return nil
}

// EnsureProfiles creates the ctx_profiles bucket, or updates it when it
// exists, and returns it.
func EnsureProfiles(ctx context.Context, js jetstream.JetStream, opts ...Option) (jetstream.KeyValue, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, ProfilesConfig(opts...))
	if err != nil {
		return nil, fmt.Errorf("ensure bucket %s: %w", ProfilesBucket, err)
	}
	return kv, nil
}
