package bus

import (
	"log/slog"
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
	replicas   int
	partitions int
	maxAge     time.Duration
	// asked records which settings an option set, as opposed to defaults:
	// keeping an existing value against an explicit request is a warning.
	askedReplicas, askedMaxAge, askedPartitions bool
	log                                         *slog.Logger
}

func buildOptions(opts []Option) options {
	o := options{replicas: 1, partitions: DefaultPartitions}
	for _, f := range opts {
		f(&o)
	}
	if o.log == nil {
		o.log = slog.Default()
	}
	return o
}

// WithReplicas sets the replica count of both streams and the bucket: 1 (the
// default) for a single server, 3 for a cluster. It applies when ctxpipe
// creates them, or raises the replicas of existing ones; it never lowers them.
func WithReplicas(n int) Option {
	return func(o *options) {
		if n > 0 {
			o.replicas = n
			o.askedReplicas = true
		}
	}
}

// WithMaxAge bounds how long the streams keep messages (0 = for ever).
// SQLite holds the full history, so the streams only need to cover replay
// and recovery. It applies when ctxpipe creates the streams; an existing
// stream keeps its own limit.
func WithMaxAge(d time.Duration) Option {
	return func(o *options) { o.maxAge, o.askedMaxAge = d, true }
}

// WithPartitions sets N, the number of partitions of CTX_IN's transform,
// when ctxpipe creates the stream (or adds the transform to one created
// before partitions). An existing transform keeps its N.
func WithPartitions(n int) Option {
	return func(o *options) {
		if n > 0 && n <= MaxPartitions {
			o.partitions, o.askedPartitions = n, true
		}
	}
}

// WithLogger sets the logger EnsureStreams and EnsureProfiles report what
// they found through (nil: slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// InStreamConfig is the configuration of CTX_IN: the two input subject
// forms, the tenant form partitioned by the server (see InputTransform).
// Nothing else is accepted, so a malformed subject fails at the publisher
// (no stream answers) instead of sitting in the stream unconsumed.
func InStreamConfig(opts ...Option) jetstream.StreamConfig {
	c := streamConfig(StreamIn, "ctxpipe inputs: turns, condense, overflow and rewind requests", sharedInputs, opts)
	c.Subjects = []string{sharedInputs, tenantInputs}
	c.SubjectTransform = InputTransform(buildOptions(opts).partitions)
	// A client may record several inputs as one atomic batch (Nats-Batch-Id,
	// Nats-Batch-Sequence, Nats-Batch-Commit): all are stored, or none.
	c.AllowAtomicPublish = true
	// No direct gets: a takeover asks the stream whether it holds any of a
	// partition's inputs the consumer left unacked, and a replica may not
	// hold them yet.
	c.AllowDirect = false
	return c
}

// StateStreamConfig is the configuration of CTX_STATE, the changelog. It is
// the source of truth every instance's SQLite is rebuilt from, so it never
// ages messages out, whatever WithMaxAge says for the others.
func StateStreamConfig(opts ...Option) jetstream.StreamConfig {
	c := streamConfig(StreamState, "ctxpipe changelog: every committed change, per partition", StateSubjects, opts)
	c.MaxAge, c.MaxBytes, c.Duplicates = 0, -1, DuplicateWindow
	// No direct gets: a writer whose append was refused reads the message
	// after its fence and the partition's last one, and a direct get may be
	// answered by a replica that does not have them yet.
	c.AllowDirect = false
	return c
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
		Duplicates:  duplicates(o.maxAge),
		MaxMsgSize:  MaxMsgSize,
		MaxAge:      o.maxAge,
		MaxBytes:    -1, // the operator's to set (ReconcileStreams keeps it)
		Replicas:    o.replicas,
	}
}

// duplicates is the duplicate window a stream with the given max age can
// have: the server refuses a window longer than the max age.
func duplicates(maxAge time.Duration) time.Duration {
	if maxAge > 0 && maxAge < DuplicateWindow {
		return maxAge
	}
	return DuplicateWindow
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
