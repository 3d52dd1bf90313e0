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

	"github.com/nats-io/nats.go/jetstream"
)

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
	if (want.Name == StreamState || want.Name == StreamIn) && next.AllowDirect {
		// Owned: a replica may answer a direct get before it holds what
		// the leader acknowledged, and both streams are asked what they
		// hold (the changelog by a writer whose append was refused, see
		// StateStreamConfig; the inputs by a takeover's read).
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
