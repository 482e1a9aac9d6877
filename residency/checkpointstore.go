package residency

import (
	"context"

	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/residency/checkpoint"
	"github.com/warmfleet/warmfleet/schemas"
)

// RemoteCheckpoints is a session's checkpoint store as its lease holder
// reaches it: every operation a request to the control plane, which keeps
// the checkpoints and answers only the holder of the session's lease at
// Epoch (a stale holder is refused ErrNotLeaseHolder). Bodies travel as
// msgpack, so a chunk crosses as its bytes.
type RemoteCheckpoints struct {
	Remote *Remote
	Key    Key
	Epoch  ResidencyEpoch
}

var _ checkpoint.Store = (*RemoteCheckpoints)(nil)

// ChunkSize is the largest chunk that fits a request
// (schemas.MaxCheckpointPieceBytes): what a host's Take cuts files into.
const ChunkSize = schemas.MaxCheckpointPieceBytes

// ChunkSizeFor is ChunkSize, or less on a connection whose server takes
// smaller messages (maxPayload, nats.Conn.MaxPayload), so that a chunk and
// its request still fit one; never below checkpoint.MinChunkSize.
func ChunkSizeFor(maxPayload int64) int64 {
	return max(min(ChunkSize, maxPayload-(schemas.MaxNodeMessageBytes-ChunkSize)), checkpoint.MinChunkSize)
}

func (c *RemoteCheckpoints) call(ctx context.Context, op schemas.ResidencyOp, req schemas.CheckpointRequest) (schemas.CheckpointContent, error) {
	req.Key, req.Epoch = WireKey(c.Key), c.Epoch
	return callIn[schemas.CheckpointContent](ctx, c.Remote, op, req, codec.MsgPack)
}

// HasChunk implements checkpoint.Store.
func (c *RemoteCheckpoints) HasChunk(ctx context.Context, digest string) (bool, error) {
	rep, err := c.call(ctx, schemas.ResidencyChunkHas, schemas.CheckpointRequest{Digest: digest})
	return rep.Has, err
}

// PutChunk implements checkpoint.Store.
func (c *RemoteCheckpoints) PutChunk(ctx context.Context, digest string, ch checkpoint.Chunk) error {
	_, err := c.call(ctx, schemas.ResidencyChunkPut, schemas.CheckpointRequest{Digest: digest, Data: ch.Data, Compressed: ch.Compressed})
	return err
}

// GetChunk implements checkpoint.Store.
func (c *RemoteCheckpoints) GetChunk(ctx context.Context, digest string) (checkpoint.Chunk, error) {
	rep, err := c.call(ctx, schemas.ResidencyChunkGet, schemas.CheckpointRequest{Digest: digest})
	return checkpoint.Chunk{Data: rep.Data, Compressed: rep.Compressed}, err
}

// PutManifest implements checkpoint.Store.
func (c *RemoteCheckpoints) PutManifest(ctx context.Context, id checkpoint.ID, record []byte) error {
	_, err := c.call(ctx, schemas.ResidencyRecordPut, schemas.CheckpointRequest{Sequence: id.Sequence, RecordEpoch: id.Epoch, Data: record})
	return err
}

// GetManifest implements checkpoint.Store.
func (c *RemoteCheckpoints) GetManifest(ctx context.Context, id checkpoint.ID) ([]byte, error) {
	rep, err := c.call(ctx, schemas.ResidencyRecordGet, schemas.CheckpointRequest{Sequence: id.Sequence, RecordEpoch: id.Epoch})
	return rep.Data, err
}
