package pipeline

import (
	"fmt"
	"time"
)

// Config tunes the runner. Zero fields take the defaults of DefaultConfig.
type Config struct {
	// Consumer is the durable pull consumer's name on CTX_IN.
	Consumer string
	// Lanes is how many workers apply inputs: how many conversations are
	// worked on at once. A conversation is held by one worker at a time.
	Lanes int
	// LaneBuffer is how many inputs per worker may be fetched ahead; with
	// MaxBatch it sizes the consumer's MaxAckPending, which bounds memory.
	LaneBuffer int
	// LaneBatch is how many of a conversation's waiting inputs a worker
	// applies before one commit.
	LaneBatch int
	// MaxBatch caps the inputs (across workers) in one SQLite transaction,
	// and MaxCommitBytes their payload bytes (a batch over it goes alone).
	MaxBatch       int
	MaxCommitBytes int
	// AckWait is the consumer's ack wait; in-progress acks are sent every
	// third of it while an input is held.
	AckWait time.Duration
	// MaxDeliver: an input delivered this many times is rejected as poison.
	MaxDeliver int
	// RetryBudget bounds how long a worker retries a transient failure.
	RetryBudget time.Duration
	// MaxInputBytes rejects larger payloads (too_large).
	MaxInputBytes int
	// MaxQueryReads bounds the queries reading the store at once, and
	// MaxQueryWaits the wait_for waits pending; one tenant (the token of
	// ctx.q.<tenant>.<verb>; the service's own account is one too) may hold
	// at most a quarter of the queries in flight, so that no tenant's flood
	// answers every other tenant "too many".
	MaxQueryReads int
	MaxQueryWaits int
	// MaxHeldBytes bounds the payload bytes fetched and not yet acked; past
	// it the runner stops fetching until workers catch up.
	MaxHeldBytes int
	// PullExpiry is how long one pull request waits on the server; the
	// consumer's heartbeats come every fifth of it, and two missed ones make
	// the runner rebuild its consumer.
	PullExpiry time.Duration
	// ProbeInterval is how often the runner asks the server about its
	// consumer; Ready fails after three intervals without word from it.
	ProbeInterval time.Duration
	// ShutdownTimeout bounds a graceful stop.
	ShutdownTimeout time.Duration
	// PinnedTTL is how long a partition's owner may go without pulling
	// before the server gives the partition to a standby: the failover
	// time after an instance dies. It must exceed PullExpiry.
	PinnedTTL time.Duration
	// Name is this instance's name among the running ones (Deps.Members);
	// with both, the runner hands partitions over to the instances they
	// prefer every RebalanceEvery.
	Name           string
	RebalanceEvery time.Duration
	// CatchUpTimeout bounds how long a starting instance leaves the
	// partitions to the others while its follower catches up with the
	// changelog (with others running; alone, it pulls at once).
	CatchUpTimeout time.Duration
	// Standby is how many instances besides its owner keep each
	// partition's state (follow its changelog), ready to take it over
	// within seconds; 0: a new owner restores the partition from the
	// changelog when it takes it over. DefaultConfig has 1; a Config
	// literal that leaves it 0 asks for none.
	Standby int
	// MaxLogPiece bounds one changelog message (default: the connection's
	// max payload): a record over it is cut into pieces.
	MaxLogPiece int
	// StrayInterval is how often the runner looks for inputs CTX_IN stored
	// where no partition's consumer reads them (strays.go), and rejects
	// them.
	StrayInterval time.Duration
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		Consumer:        "ctxpipe",
		Lanes:           64,
		LaneBuffer:      256,
		LaneBatch:       64,
		MaxBatch:        1024,
		MaxCommitBytes:  16 << 20,
		AckWait:         30 * time.Second,
		MaxDeliver:      10,
		RetryBudget:     2 * time.Minute,
		MaxInputBytes:   4 << 20,
		MaxHeldBytes:    256 << 20,
		MaxQueryReads:   256,
		MaxQueryWaits:   65536,
		ShutdownTimeout: 20 * time.Second,
		PullExpiry:      time.Second,
		PinnedTTL:       3 * time.Second,
		RebalanceEvery:  time.Second,
		CatchUpTimeout:  2 * time.Minute,
		ProbeInterval:   2 * time.Second,
		Standby:         1,
		StrayInterval:   30 * time.Second,
	}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Consumer == "" {
		c.Consumer = d.Consumer
	}
	orDefault(&c.Lanes, d.Lanes)
	orDefault(&c.LaneBuffer, d.LaneBuffer)
	orDefault(&c.LaneBatch, d.LaneBatch)
	orDefault(&c.MaxBatch, d.MaxBatch)
	orDefault(&c.MaxCommitBytes, d.MaxCommitBytes)
	orDefault(&c.AckWait, d.AckWait)
	orDefault(&c.MaxDeliver, d.MaxDeliver)
	orDefault(&c.RetryBudget, d.RetryBudget)
	orDefault(&c.MaxInputBytes, d.MaxInputBytes)
	orDefault(&c.MaxHeldBytes, d.MaxHeldBytes)
	orDefault(&c.MaxQueryReads, d.MaxQueryReads)
	orDefault(&c.MaxQueryWaits, d.MaxQueryWaits)
	orDefault(&c.ShutdownTimeout, d.ShutdownTimeout)
	orDefault(&c.PullExpiry, d.PullExpiry)
	orDefault(&c.PinnedTTL, d.PinnedTTL)
	orDefault(&c.RebalanceEvery, d.RebalanceEvery)
	orDefault(&c.CatchUpTimeout, d.CatchUpTimeout)
	orDefault(&c.ProbeInterval, d.ProbeInterval)
	orDefault(&c.StrayInterval, d.StrayInterval)
	return c
}

// orDefault replaces a zero or negative setting with its default.
func orDefault[T int | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// Validate reports settings that cannot work together.
func (c Config) Validate() error {
	c = c.withDefaults()
	if c.AckWait < time.Second {
		return fmt.Errorf("ack wait %v is too short: in-progress acks need at least 1s", c.AckWait)
	}
	if c.PullExpiry < time.Second {
		return fmt.Errorf("pull expiry %v is too short: the server needs at least 1s", c.PullExpiry)
	}
	if c.PinnedTTL < c.PullExpiry+time.Second {
		return fmt.Errorf("pinned TTL %v must exceed the pull expiry %v by a second: the owner renews its pin with every pull", c.PinnedTTL, c.PullExpiry)
	}
	if c.Standby < 0 {
		return fmt.Errorf("standby %d: want 0 or more instances", c.Standby)
	}
	if c.MaxDeliver < 2 {
		return fmt.Errorf("max deliver %d leaves no room for a redelivery", c.MaxDeliver)
	}
	return nil
}
