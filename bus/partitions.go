package bus

import (
	"fmt"
	"hash/fnv"
	"regexp"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// Partitions. CTX_IN's subject transform puts every tenant's input under a
// partition the server computes from the tenant and conversation tokens:
//
//	ctx.in.<tenant>.<conv>.<kind>  is stored as  ctx.in.<p>.<tenant>.<conv>.<kind>
//
// so every input of a conversation lands in the same partition, in order, and
// one consumer instance at a time owns a partition (one durable consumer per
// partition, pinned to one client). Inputs published without a tenant
// (ctx.in.<conv>.<kind>, only possible inside the service's own account) are
// not transformed: they form one more partition, numbered N, the shared one.
//
// N is fixed for a deployment: changing it would move conversations between
// partitions while their inputs are in flight. The stream is the source of
// truth (PartitionsOf): an existing transform is never changed.
const (
	// DefaultPartitions is N when ctxpipe creates CTX_IN. Each partition is
	// a durable consumer, and the server rewrites an active consumer's
	// state file up to ten times a second: with 64 partitions that was a
	// tenth to a sixth of the embedded service's CPU, and 50 conversations
	// went end to end 20–80 % faster on 16 (operations.md, section 4.1).
	// Several instances share few partitions unevenly: a deployment of
	// more than one sets --partitions when it creates the streams.
	DefaultPartitions = 16
	// MaxPartitions bounds --partitions: each partition is a durable
	// consumer and a changelog subject.
	MaxPartitions = 1024

	// StreamState is the changelog: every committed change, per partition
	// (ctx.state.<p>), from which any instance rebuilds its SQLite.
	StreamState = "CTX_STATE"
	// StateSubjects is CTX_STATE's subject filter.
	StateSubjects = "ctx.state.>"
	// MembersBucket is the KV bucket where running instances announce
	// themselves (key = instance name), so each can tell which partitions
	// it should prefer.
	MembersBucket = "ctx_members"

	tenantInputs = "ctx.in.*.*.*" // ctx.in.<tenant>.<conv>.<kind>
	sharedInputs = "ctx.in.*.*"   // ctx.in.<conv>.<kind>
)

// InputTransform is CTX_IN's subject transform for n partitions.
func InputTransform(n int) *jetstream.SubjectTransformConfig {
	return &jetstream.SubjectTransformConfig{
		Source:      tenantInputs,
		Destination: fmt.Sprintf("ctx.in.{{partition(%d,1,2)}}.{{wildcard(1)}}.{{wildcard(2)}}.{{wildcard(3)}}", n),
	}
}

var partitionFn = regexp.MustCompile(`\{\{\s*partition\(\s*(\d+)\s*,`)

// PartitionsOf returns N as CTX_IN's configuration has it, or 0 when the
// stream has no partition transform (one created before partitions).
func PartitionsOf(cfg jetstream.StreamConfig) int {
	if cfg.SubjectTransform == nil || cfg.SubjectTransform.Source != tenantInputs {
		return 0
	}
	m := partitionFn.FindStringSubmatch(cfg.SubjectTransform.Destination)
	if m == nil {
		return 0
	}
	n, err := strconv.Atoi(m[1])
	if err != nil || n <= 0 || n > MaxPartitions {
		return 0
	}
	return n
}

// PartitionFilter is the filter subject of partition p's consumer; p == n
// is the shared partition of inputs without a tenant.
func PartitionFilter(p, n int) string {
	if p == n {
		return sharedInputs
	}
	return fmt.Sprintf("ctx.in.%d.*.*.*", p)
}

// ConsumerFor is the durable name of partition p's consumer.
func ConsumerFor(prefix string, p int) string { return fmt.Sprintf("%s-p%d", prefix, p) }

// StateSubject is partition p's changelog subject.
func StateSubject(p int) string { return "ctx.state." + strconv.Itoa(p) }

// SplitInputSubject reads a stored CTX_IN subject: the partition and the
// subject as it was published (ctx.in.<tenant>.<conv>.<kind> or
// ctx.in.<conv>.<kind>). ok is false for a subject of neither form.
func SplitInputSubject(subject string, n int) (p int, published string, ok bool) {
	rest, found := strings.CutPrefix(subject, "ctx.in.")
	if !found {
		return 0, subject, false
	}
	switch strings.Count(rest, ".") {
	case 1:
		return n, subject, true
	case 3:
		tok, tail, _ := strings.Cut(rest, ".")
		p, err := strconv.Atoi(tok)
		if err != nil || p < 0 || p >= n || strconv.Itoa(p) != tok {
			return 0, subject, false
		}
		return p, "ctx.in." + tail, true
	}
	return 0, subject, false
}

// PartitionOfState reads the partition of a changelog subject.
func PartitionOfState(subject string) (int, bool) {
	tok, ok := strings.CutPrefix(subject, "ctx.state.")
	if !ok {
		return 0, false
	}
	p, err := strconv.Atoi(tok)
	return p, err == nil && p >= 0 && strconv.Itoa(p) == tok
}

// PartitionOf is the partition CTX_IN's transform puts a tenant's
// conversation in, computed as the server's partition(n,1,2) does: FNV-1a
// (32 bits) of the tenant and conversation tokens, one after the other,
// modulo n. A conversation without a tenant is in the shared partition, n.
func PartitionOf(tenant, conv string, n int) int {
	if tenant == "" {
		return n
	}
	if n <= 0 {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(tenant))
	h.Write([]byte(conv))
	return int(h.Sum32() % uint32(n))
}
