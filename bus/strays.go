package bus

import (
	"strconv"
	"strings"
)

// Strays. nats-server takes a token that is a literal wildcard in a published
// subject (ctx.in.acme.*.turn, ctx.in.acme.>.turn) for any token when it
// checks permissions and picks a stream, so CTX_IN stores it; but the
// partition transform skips a subject that is not literal, and a consumer
// delivers a stored subject only when its filter covers it token by token,
// where a stored '>' is covered by nothing but a filter's own '>'. Such an
// input, a stray, sits under a subject that no partition's consumer reads.
// nats.conf refuses what it can at the edge (a '*' token, see its CTX
// mappings); a '>' token can be refused by no permission, mapping or stream
// subject, so the service looks for strays and rejects them.

// StraySubjects is the shape of every stray of the tenant form: a subject
// ctx.in.<tenant>.<conv>.<kind> the transform left as it was. Inputs the
// partitions read are stored with four tokens after ctx.in. (the tenant
// form, transformed) or two (the shared form), so a listing of the stored
// subjects under this filter holds strays only.
const StraySubjects = "ctx.in.*.*.*"

// Reached reports whether subject, as CTX_IN stores it, is delivered by one
// of the partition consumers of a stream with n partitions (PartitionFilter):
// ctx.in.<conv>.<kind> by the shared one, ctx.in.<p>.<tenant>.<conv>.<kind>
// by partition p's. It follows the server's rule: a stored token that is a
// literal '*' is covered only by a filter's '*', and one that is a literal
// '>' by no filter token but '>', which no partition filter has.
func Reached(subject string, n int) bool {
	rest, ok := strings.CutPrefix(subject, "ctx.in.")
	if !ok {
		return false
	}
	tokens := strings.Split(rest, ".")
	for _, t := range tokens {
		if t == "" || t == ">" {
			return false
		}
	}
	switch len(tokens) {
	case 2:
		return true
	case 4:
		p, err := strconv.Atoi(tokens[0])
		return err == nil && p >= 0 && p < n && strconv.Itoa(p) == tokens[0]
	}
	return false
}

// StrayFilter is a consumer filter that delivers every message stored under
// subject, a stray's subject as CTX_IN stores it: the subject up to its first
// wildcard token, and '>' from there. A filter with the wildcard tokens kept
// would not do: its '*' does not deliver a stored '>', though the server
// counts such a message as pending for it.
func StrayFilter(subject string) string {
	tokens := strings.Split(subject, ".")
	for i, t := range tokens {
		if t == "*" || t == ">" {
			return strings.Join(append(tokens[:i:i], ">"), ".")
		}
	}
	return subject
}
