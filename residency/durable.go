package residency

import (
	"context"

	"github.com/warmfleet/warmfleet/schemas"
)

// RuntimeJournal is what the durable store knows of the runtime's own
// journal for a session. The zero value is unknown, which refuses a create:
// a store that forgot to answer fails closed.
type RuntimeJournal = schemas.RuntimeJournal

// Runtime journal states.
const (
	JournalUnknown = schemas.JournalUnknown
	JournalEmpty   = schemas.JournalEmpty
	JournalPresent = schemas.JournalPresent
)

// SessionState is a session's durable state, which outlives any residency.
type SessionState = schemas.SessionState

// Checkpoint is what a release commits before it lets the runtime go; its
// Key is the wire key (KeyOf reads it).
type Checkpoint = schemas.SessionCheckpoint

// DurableStore is the session state store.
type DurableStore interface {
	// LoadSessionState returns the session's durable state.
	LoadSessionState(ctx context.Context, key Key) (SessionState, error)
	// CommitCheckpoint records a checkpoint, making the session resumable.
	// An implementation refuses (ErrEpochSuperseded) a checkpoint under an
	// epoch lower than the last one it committed, so a stale holder cannot
	// overwrite its successor's, and (ErrNotLeaseHolder) one from a host
	// that does not hold the session's lease at exactly its epoch.
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
