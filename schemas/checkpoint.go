package schemas

// A session host moves its checkpoints through the control plane, which
// keeps them in the object store bucket wf_checkpoints: chunks by digest,
// and each checkpoint's record (an index of its manifest's pieces) by
// sequence. Every operation is the lease holder's, at the lease's epoch;
// bodies and answers travel as msgpack, the chunk bytes as they are.
const (
	// ResidencyChunkHas takes a CheckpointRequest naming Digest and
	// answers CheckpointContent.Has.
	ResidencyChunkHas ResidencyOp = "chunk_has"
	// ResidencyChunkPut stores Data (Compressed: zstd) as chunk Digest.
	ResidencyChunkPut ResidencyOp = "chunk_put"
	// ResidencyChunkGet answers chunk Digest's Data and Compressed.
	ResidencyChunkGet ResidencyOp = "chunk_get"
	// ResidencyRecordPut stores Data as checkpoint (Sequence,
	// RecordEpoch)'s record; RecordEpoch must be the request's Epoch.
	ResidencyRecordPut ResidencyOp = "record_put"
	// ResidencyRecordGet answers checkpoint (Sequence, RecordEpoch)'s
	// record as Data.
	ResidencyRecordGet ResidencyOp = "record_get"
)

// MaxCheckpointPieceBytes is the largest chunk or record that travels in
// one request or answer: a node's message (MaxNodeMessageBytes) less room
// for the rest of the body.
const MaxCheckpointPieceBytes = MaxNodeMessageBytes - 16<<10

// CheckpointRequest is one checkpoint operation of a session's lease
// holder (the node in the subject) at its lease's Epoch.
type CheckpointRequest struct {
	Key   SessionKey     `json:"key"`
	Epoch ResidencyEpoch `json:"epoch"`
	// Digest names a chunk (lowercase hex SHA-256 of its content);
	// Sequence and RecordEpoch a checkpoint: its sequence, and the epoch
	// of the holder that took it (an earlier one's, read after a move).
	Digest      string `json:"digest,omitempty"`
	Sequence    uint64 `json:"sequence,omitempty"`
	RecordEpoch uint64 `json:"record_epoch,omitempty"`
	// Data and Compressed are what a put stores.
	Data       []byte `json:"data,omitempty"`
	Compressed bool   `json:"compressed,omitempty"`
}

// CheckpointContent answers a checkpoint operation: whether the chunk is
// held (chunk_has), or the chunk's or record's bytes.
type CheckpointContent struct {
	Has        bool   `json:"has,omitempty"`
	Data       []byte `json:"data,omitempty"`
	Compressed bool   `json:"compressed,omitempty"`
}

// Validate bounds a checkpoint request's body (CheckNodeSizes; its data by
// MaxCheckpointPieceBytes).
func (r *CheckpointRequest) Validate() error { return CheckNodeSizes("", r) }
