package residency

import (
	"context"

	"github.com/warmfleet/warmfleet/schemas"
)

// RuntimeJournal is what the durable store knows of the runtime's own
// journal for a session. The zero value is unknown, which refuses a create:
// a store that forgot to answer fails closed.
type RuntimeJournal int

// Runtime journal states.
const (
	JournalUnknown RuntimeJournal = iota
	JournalEmpty
	JournalPresent
)

func (j RuntimeJournal) String() string {
	switch j {
	case JournalEmpty:
		return "empty"
	case JournalPresent:
		return "present"
	default:
		return "unknown"
	}
}

// SessionState is a session's durable state, which outlives any residency.
type SessionState struct {
	// Exists reports whether the session has durable state at all.
	Exists bool
	// Namespace is the object prefix the runtime writes under. It is
	// required whether or not the session exists; an empty one is refused.
	Namespace string
	// CompatibilityID is the runtime build that wrote the state. A restore
	// onto another build is refused.
	CompatibilityID string
	// RuntimeJournal decides a create: only JournalEmpty may be created.
	RuntimeJournal RuntimeJournal
	// HasCheckpoint and CheckpointSequence are the latest checkpoint.
	HasCheckpoint      bool
	CheckpointSequence uint64
}

// Checkpoint is what a release commits before it lets the runtime go.
type Checkpoint struct {
	Key             Key
	Host            string
	Epoch           ResidencyEpoch
	Sequence        uint64
	CompatibilityID string
	Namespace       string
}

// DurableStore is the session state store.
type DurableStore interface {
	// LoadSessionState returns the session's durable state.
	LoadSessionState(ctx context.Context, key Key) (SessionState, error)
	// CommitCheckpoint records a checkpoint, making the session resumable.
	// An implementation refuses (ErrEpochSuperseded) a checkpoint under an
	// epoch lower than the last one it committed, so a stale holder cannot
	// overwrite its successor's.
	CommitCheckpoint(ctx context.Context, cp Checkpoint) error
}

// Mode says whether an attach creates a session or resumes one.
type Mode = schemas.SessionMode

// Attach modes.
const (
	// ModeCreate starts a session with no durable state; the runtime
	// journal must be known to be empty.
	ModeCreate Mode = "create"
	// ModeResume restores a session from its durable state, which must
	// exist and have been written by this host's runtime build.
	ModeResume Mode = "resume"
)
