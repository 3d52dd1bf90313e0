package pipeline

import (
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ctxpipe/ctxpipe/schema"
	"github.com/ctxpipe/ctxpipe/store"
)

// job is one fetched JetStream message on its way through a worker.
type job struct {
	msg       jetstream.Msg
	partition int
	subject   string // as published: the partition token taken out
	conv      string // the subject's conversation token, "" when unreadable
	seq       uint64 // stream sequence: the id of last resort
	deliver   uint64 // delivery count
	touched   time.Time
	stored    time.Time // when CTX_IN stored it (the server's clock), and
	fetched   time.Time // when it came here: for the latency stages

	hashed bool
	hash   [32]byte // of the payload, once computed (payloadHash)
}

// payloadHash is the sha256 of the payload, computed once: the duplicate
// check, the changelog record and the store all need it, and for a 4 MiB
// turn it is not free.
func (j *job) payloadHash() [32]byte {
	if !j.hashed {
		j.hash, j.hashed = store.PayloadHash(j.msg.Data()), true
	}
	return j.hash
}

// tenant is the tenant the input came from, as its subject names it: the
// scope of its id (store.InputRecord.Tenant reads the same).
func (j *job) tenant() string { return schema.SubjectTenant(j.subject) }

// inputKey identifies an input: its id is unique within its tenant only.
type inputKey struct{ tenant, id string }

// storedPayload is the job's payload as an input row keeps it, with the
// whole payload's hash and size.
func (j *job) storedPayload(status store.Status) ([]byte, *store.StoredPayload) {
	data := j.msg.Data()
	sp := &store.StoredPayload{Hash: j.payloadHash(), Size: len(data)}
	if status == store.StatusRejected && len(data) > store.RejectedPayloadPrefix {
		data = data[:store.RejectedPayloadPrefix]
	}
	return data, sp
}
