package checkpoint

import (
	"context"
	"fmt"
)

// Store keeps one session's checkpoints: chunks by digest (lowercase hex
// SHA-256 of their content), and each checkpoint's record (record.go: a
// small index of its manifest's pieces, which are chunks) by sequence. A
// checkpoint exists once its record does: Take puts every chunk first.
type Store interface {
	HasChunk(ctx context.Context, digest string) (bool, error)
	PutChunk(ctx context.Context, digest string, c Chunk) error
	// GetChunk and GetManifest answer an *Error of CodeIncomplete for one
	// the store does not hold.
	GetChunk(ctx context.Context, digest string) (Chunk, error)
	PutManifest(ctx context.Context, id ID, record []byte) error
	GetManifest(ctx context.Context, id ID) ([]byte, error)
}

// ID names a checkpoint: its sequence in the session, and the lease epoch
// of the holder that took it. Two holders that both take sequence n (a
// stale one among them) write two records, never one over the other; the
// session's durable state says which one was committed.
type ID struct {
	Sequence uint64 `json:"sequence"`
	Epoch    uint64 `json:"epoch"`
}

func (id ID) String() string { return fmt.Sprintf("checkpoint %d (epoch %d)", id.Sequence, id.Epoch) }

// DefaultWorkers is how many chunks Take and Restore have in flight at
// once: a store is usually a request away (RemoteCheckpoints), and eight
// hide its round trips (docs/benchmarks.md, checkpoint).
const DefaultWorkers = 8

// PruneStore is a Store that lists and deletes, as Prune needs.
type PruneStore interface {
	Store
	// IDs lists the checkpoints held, ascending; Chunks the chunks.
	IDs(ctx context.Context) ([]ID, error)
	Chunks(ctx context.Context) ([]string, error)
	DeleteManifest(ctx context.Context, id ID) error
	DeleteChunk(ctx context.Context, digest string) error
}
