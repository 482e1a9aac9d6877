package checkpoint

import "context"

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
	PutManifest(ctx context.Context, seq uint64, record []byte) error
	GetManifest(ctx context.Context, seq uint64) ([]byte, error)
}

// PruneStore is a Store that lists and deletes, as Prune needs.
type PruneStore interface {
	Store
	// Sequences lists the checkpoints held, ascending; Chunks the chunks.
	Sequences(ctx context.Context) ([]uint64, error)
	Chunks(ctx context.Context) ([]string, error)
	DeleteManifest(ctx context.Context, seq uint64) error
	DeleteChunk(ctx context.Context, digest string) error
}
