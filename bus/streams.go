// Package bus holds what the ctxpipe service and its clients share about
// NATS: the names and configurations of the streams, the consumer, the
// profiles bucket and the queue group; how to connect; and how to publish an
// input so that JetStream can drop duplicates.
package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/internal/backoff"
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

// Finding is one way an existing stream or bucket differs from what ctxpipe
// asks for, and what ctxpipe did about it. ctxpipe owns a stream's subjects,
// duplicate window and message size bound, and sets them; it raises replicas
// when asked for more. Every other setting is the operator's: a difference is
// reported and the existing value kept.
type Finding struct {
	Resource string // "stream CTX_IN", "bucket ctx_profiles"
	Field    string // "replicas", "max_age", "subjects", ...
	Have     string // the value found
	Want     string // the value ctxpipe asks for
	Changed  bool   // ctxpipe set Want; otherwise it kept Have
	asked    bool   // Want was asked for explicitly (an option or a need)
}

func (f Finding) String() string {
	if f.Changed {
		return fmt.Sprintf("%s %s was %s, ctxpipe sets %s", f.Resource, f.Field, f.Have, f.Want)
	}
	return fmt.Sprintf("%s has %s %s, ctxpipe asks %s: keeping %s (change it with the nats CLI if meant)",
		f.Resource, f.Field, f.Have, f.Want, f.Have)
}

// Level is how loud the finding should be: a warning when an explicit
// request was not honoured, information otherwise.
func (f Finding) Level() slog.Level {
	if !f.Changed && f.asked {
		return slog.LevelWarn
	}
	return slog.LevelInfo
}

// EnsureStreams creates CTX_IN and CTX_EVENTS, or reconciles existing ones
// (see Finding), and logs every finding through the WithLogger logger.
func EnsureStreams(ctx context.Context, js jetstream.JetStream, opts ...Option) error {
	findings, err := ReconcileStreams(ctx, js, opts...)
	logFindings(ctx, buildOptions(opts).log, findings)
	return err
}

// ReconcileStreams creates CTX_IN and CTX_EVENTS with the configuration
// above when they are missing. An existing stream gets only what ctxpipe
// owns, and more replicas when asked; everything else stays as the operator
// set it. It returns what differed.
func ReconcileStreams(ctx context.Context, js jetstream.JetStream, opts ...Option) ([]Finding, error) {
	o := buildOptions(opts)
	var all []Finding
	for _, want := range []jetstream.StreamConfig{InStreamConfig(opts...), EventsStreamConfig(opts...), StateStreamConfig(opts...)} {
		findings, err := reconcileStream(ctx, js, want, o)
		all = append(all, findings...)
		if err != nil {
			return all, err
		}
	}
	return all, nil
}

func reconcileStream(ctx context.Context, js jetstream.JetStream, want jetstream.StreamConfig, o options) ([]Finding, error) {
	s, err := js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		_, err = js.CreateStream(ctx, want)
		if err == nil {
			return nil, nil
		}
		if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return nil, fmt.Errorf("create stream %s: %w", want.Name, err)
		}
		// Another instance created it meanwhile: reconcile with that one.
		s, err = js.Stream(ctx, want.Name)
	}
	if err != nil {
		return nil, fmt.Errorf("look up stream %s: %w", want.Name, err)
	}
	next := s.CachedInfo().Config
	d := diff{resource: "stream " + want.Name}
	// Owned by ctxpipe: the subjects it publishes and consumes, the window
	// its publishers' dedup relies on, the size of the inputs it accepts.
	if !slices.Equal(next.Subjects, want.Subjects) {
		d.set("subjects", strings.Join(next.Subjects, ","), strings.Join(want.Subjects, ","))
		next.Subjects = want.Subjects
	}
	if want.SubjectTransform != nil {
		// The partition transform is ctxpipe's, but its N is fixed once
		// set: a stream that has one keeps it (PartitionsOf reads it).
		switch have := PartitionsOf(next); {
		case have == 0:
			d.set("subject_transform", transformString(next.SubjectTransform), want.SubjectTransform.Destination)
			next.SubjectTransform = want.SubjectTransform
		case have != PartitionsOf(want):
			d.keep("partitions", strconv.Itoa(have), strconv.Itoa(PartitionsOf(want)), o.askedPartitions)
		}
	}
	if dup := duplicates(next.MaxAge); next.Duplicates != dup {
		d.set("duplicates", next.Duplicates.String(), dup.String())
		next.Duplicates = dup
	}
	if next.MaxMsgSize != want.MaxMsgSize {
		d.set("max_msg_size", strconv.Itoa(int(next.MaxMsgSize)), strconv.Itoa(int(want.MaxMsgSize)))
		next.MaxMsgSize = want.MaxMsgSize
	}
	next.Replicas = d.replicas(next.Replicas, want.Replicas, o.askedReplicas)
	// The operator's: reported, kept.
	d.keep("max_age", ageString(next.MaxAge), ageString(want.MaxAge), o.askedMaxAge)
	d.keep("max_bytes", bytesString(next.MaxBytes), bytesString(want.MaxBytes), false)
	d.keep("storage", next.Storage.String(), want.Storage.String(), true)
	d.keep("retention", next.Retention.String(), want.Retention.String(), true)
	d.keep("discard", next.Discard.String(), want.Discard.String(), true)
	if want.AllowAtomicPublish && !next.AllowAtomicPublish {
		// Owned: clients record a request's turns as one batch. A stream
		// the operator made persist asynchronously cannot have it; its
		// clients then publish the inputs one by one.
		if next.PersistMode == jetstream.AsyncPersistMode {
			d.keep("allow_atomic", "false", "true", false)
		} else {
			d.set("allow_atomic", "false", "true")
			next.AllowAtomicPublish = true
		}
	}
	if want.Name == StreamState && next.AllowDirect {
		// Owned for the changelog: see StateStreamConfig.
		d.set("allow_direct", "true", "false")
		next.AllowDirect = false
	}
	d.keep("allow_direct", strconv.FormatBool(next.AllowDirect), strconv.FormatBool(want.AllowDirect), false)
	if !d.changed {
		return d.findings, nil
	}
	if _, err := js.UpdateStream(ctx, next); err != nil {
		return d.findings, fmt.Errorf("update stream %s: %w", want.Name, err)
	}
	return d.findings, waitReplicas(ctx, js, want.Name, next.Replicas)
}

// waitReplicas waits until the stream has a leader and n-1 current
// followers. Right after a stream is scaled up, its leader may move and a
// publish sent meanwhile gets no answer; ctxpipe starts consuming only once
// the stream has settled.
func waitReplicas(ctx context.Context, js jetstream.JetStream, name string, n int) error {
	for {
		s, err := js.Stream(ctx, name)
		if err == nil {
			if c := s.CachedInfo().Cluster; c == nil || (c.Leader != "" && len(c.Replicas) == n-1 && allCurrent(c.Replicas)) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %d replicas of %s: %w", n, name, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func allCurrent(peers []*jetstream.PeerInfo) bool {
	for _, p := range peers {
		if !p.Current || p.Offline {
			return false
		}
	}
	return true
}

// EnsureProfiles creates the ctx_profiles bucket, or reconciles an existing
// one (its replicas only rise), logs every finding through the WithLogger
// logger, and returns the bucket.
func EnsureProfiles(ctx context.Context, js jetstream.JetStream, opts ...Option) (jetstream.KeyValue, error) {
	kv, findings, err := ReconcileProfiles(ctx, js, opts...)
	logFindings(ctx, buildOptions(opts).log, findings)
	return kv, err
}

// ReconcileProfiles is EnsureProfiles without the logging: it returns what
// differed. Of an existing bucket ctxpipe changes only the replicas, and
// only up; its history and storage are the operator's.
func ReconcileProfiles(ctx context.Context, js jetstream.JetStream, opts ...Option) (jetstream.KeyValue, []Finding, error) {
	o := buildOptions(opts)
	want := ProfilesConfig(opts...)
	kv, err := js.CreateKeyValue(ctx, want)
	if err == nil {
		return kv, nil, nil
	}
	if !errors.Is(err, jetstream.ErrBucketExists) {
		return nil, nil, fmt.Errorf("create bucket %s: %w", ProfilesBucket, err)
	}
	// A bucket is a stream: reconcile that, so that every setting ctxpipe
	// does not change stays exactly as it is.
	name := "KV_" + ProfilesBucket
	s, err := js.Stream(ctx, name)
	if err != nil {
		return nil, nil, fmt.Errorf("look up bucket %s: %w", ProfilesBucket, err)
	}
	next := s.CachedInfo().Config
	d := diff{resource: "bucket " + ProfilesBucket}
	next.Replicas = d.replicas(next.Replicas, want.Replicas, o.askedReplicas)
	d.keep("history", strconv.FormatInt(next.MaxMsgsPerSubject, 10), strconv.Itoa(int(want.History)), false)
	d.keep("storage", next.Storage.String(), want.Storage.String(), true)
	if d.changed {
		if _, err := js.UpdateStream(ctx, next); err != nil {
			return nil, d.findings, fmt.Errorf("update bucket %s: %w", ProfilesBucket, err)
		}
		if err := waitReplicas(ctx, js, name, next.Replicas); err != nil {
			return nil, d.findings, err
		}
	}
	kv, err = js.KeyValue(ctx, ProfilesBucket)
	if err != nil {
		return nil, d.findings, fmt.Errorf("open bucket %s: %w", ProfilesBucket, err)
	}
	return kv, d.findings, nil
}

// diff collects the findings about one stream.
type diff struct {
	resource string
	findings []Finding
	changed  bool
}

func (d *diff) set(field, have, want string) {
	d.findings = append(d.findings, Finding{Resource: d.resource, Field: field, Have: have, Want: want, Changed: true, asked: true})
	d.changed = true
}

func (d *diff) keep(field, have, want string, asked bool) {
	if have != want {
		d.findings = append(d.findings, Finding{Resource: d.resource, Field: field, Have: have, Want: want, asked: asked})
	}
}

// replicas returns the replicas to run with: more when asked for more, and
// never fewer. Losing a node of an R1 stream stops it, so lowering is never
// ctxpipe's call.
func (d *diff) replicas(have, want int, asked bool) int {
	switch {
	case want > have:
		d.set("replicas", strconv.Itoa(have), strconv.Itoa(want))
		return want
	case want < have:
		d.keep("replicas", strconv.Itoa(have), strconv.Itoa(want), asked)
	}
	return have
}

func transformString(t *jetstream.SubjectTransformConfig) string {
	if t == nil {
		return "none"
	}
	return t.Source + " -> " + t.Destination
}

func ageString(d time.Duration) string {
	if d <= 0 {
		return "unlimited"
	}
	return d.String()
}

func bytesString(n int64) string {
	if n < 0 {
		return "unlimited"
	}
	return strconv.FormatInt(n, 10)
}

func logFindings(ctx context.Context, log *slog.Logger, findings []Finding) {
	for _, f := range findings {
		log.Log(ctx, f.Level(), f.String(), "resource", f.Resource, "field", f.Field, "have", f.Have, "want", f.Want, "changed", f.Changed)
	}
}

// attemptTimeout bounds one attempt of RetryStart: a JetStream request lost
// in an election is sent again rather than waited for until ctx ends.
var attemptTimeout = 10 * time.Second

// RetryStart runs op, one step of starting against JetStream (ensuring the
// streams, the bucket, the consumer), until it succeeds, fails for good
// (see Transient), or ctx is done; then it returns an error wrapping
// ctx.Err(). Each attempt gets at most attemptTimeout. Each transient
// failure is logged with the wait before the next attempt (backoff as
// ConnectRetry's), and a success after failures is logged too. A broker that
// is up but whose JetStream is not ready yet (a cluster electing its meta
// leader, too few nodes for the replicas) thus delays the start instead of
// failing it.
func RetryStart(ctx context.Context, log *slog.Logger, what string, op func(context.Context) error) error {
	if log == nil {
		log = slog.Default()
	}
	b := backoff.New(startRetry)
	start := time.Now()
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		err := op(actx)
		cancel()
		if err == nil {
			if attempt > 1 {
				log.Info(what+" succeeded", "attempts", attempt, "waited", time.Since(start).Round(time.Millisecond))
			}
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: gave up after %d attempts: %w (last error: %v)", what, attempt, ctx.Err(), err)
		}
		if !Transient(err) {
			return err
		}
		wait := b.Next()
		log.Warn(fmt.Sprintf("%s failed, retrying in %v", what, wait.Round(time.Millisecond)), "attempt", attempt, "err", err)
		if serr := backoff.Sleep(ctx, wait); serr != nil {
			return fmt.Errorf("%s: gave up after %d attempts: %w (last error: %v)", what, attempt, serr, err)
		}
	}
}

// Transient reports whether a JetStream request failed in a way that may go
// away by itself: no answer in time, no responder, a connection being
// re-established, or the server answering 503 (JetStream not ready, the
// cluster without a meta leader, too few nodes up for the replicas). A
// request the server refuses (a bad configuration, a permission) is not.
func Transient(err error) bool {
	var apiErr *jetstream.APIError
	switch {
	case errors.As(err, &apiErr):
		// 503: no quorum, a leader being elected. A placement that failed
		// because a peer is offline (a node restarting, a cluster still
		// forming) clears too; one with too few peers at all does not.
		return apiErr.Code == 503 || strings.Contains(apiErr.Description, "peer offline")
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout),
		errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrNoStreamResponse),
		errors.Is(err, nats.ErrDisconnected), errors.Is(err, nats.ErrConnectionReconnecting):
		return true
	}
	return false
}
