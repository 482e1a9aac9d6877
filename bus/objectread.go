package bus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrObjectLink: the object named is a link, not content.
var ErrObjectLink = errors.New("bus: the object is a link, not content")

// ObjectRead is a pull consumer of one object's chunks that its creator
// made for a reader that may not create consumers (an artifact login), and
// the object's info, so that reader needs no meta read either.
type ObjectRead struct {
	// Consumer is the consumer's name on ObjectStream(bucket).
	Consumer string
	// Digest is the object's record of its content ("SHA-256=<base64url>").
	Digest string
	Size   uint64
	Chunks uint32
	// StartChunk is the first chunk the consumer delivers; StartByte is
	// where it begins in the object.
	StartChunk uint32
	StartByte  int64
}

// ObjectReadConfig names and bounds the consumer CreateObjectRead makes.
type ObjectReadConfig struct {
	// Name is the consumer's name (ArtifactConsumer for an artifact login).
	Name string
	// Inactive lets the server delete the consumer once nobody pulls it for
	// this long, so one a reader leaves behind does not outlive its fetch.
	Inactive time.Duration
	// Metadata is shown with the consumer's info (who it was made for).
	Metadata map[string]string
}

// ArtifactConsumer is the name of the consumer the control plane creates
// for node nodeID's artifact fetch id: the grant records it, the login may
// pull it and nothing else.
func ArtifactConsumer(nodeID, id string) string { return "artifact_" + nodeID + "_" + id }

// CreateObjectRead reads object's info in bucket and creates an ephemeral
// pull consumer (no acks, in memory, one replica) filtered to that object's
// chunks, starting at the chunk that holds byte offset.
//
// Byte offset is chunk k = offset/ChunkSize if every chunk but the last is
// full, which holds iff (chunks-1)*ChunkSize + len(last chunk) == size. If
// the chunks are also contiguous in the stream, chunk k is at
// last-chunk-sequence - (chunks-1) + k; the consumer starts there, and the
// reader checks that the first delivery's pending count says exactly
// chunks-k-1 follow it, which holds only if exactly k chunks precede the
// start. Where the sizes do not add up the consumer starts at the first
// chunk (StartChunk and StartByte 0) and the reader skips what it holds.
func CreateObjectRead(ctx context.Context, js jetstream.JetStream, bucket, object string, offset int64, cfg ObjectReadConfig) (ObjectRead, error) {
	obs, err := js.ObjectStore(ctx, bucket)
	if err != nil {
		return ObjectRead{}, fmt.Errorf("bus: object store %s: %w", bucket, err)
	}
	info, err := obs.GetInfo(ctx, object)
	if err != nil {
		return ObjectRead{}, fmt.Errorf("bus: object %s in %s: %w", object, bucket, err)
	}
	if info.Opts != nil && info.Opts.Link != nil {
		return ObjectRead{}, fmt.Errorf("bus: object %s in %s: %w", object, bucket, ErrObjectLink)
	}
	r := ObjectRead{Consumer: cfg.Name, Digest: info.Digest, Size: info.Size, Chunks: info.Chunks}
	ccfg := jetstream.ConsumerConfig{
		Name:              cfg.Name,
		FilterSubject:     ObjectChunks(bucket, info.NUID),
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		AckPolicy:         jetstream.AckNonePolicy,
		InactiveThreshold: cfg.Inactive,
		MemoryStorage:     true,
		Replicas:          1,
		Metadata:          cfg.Metadata,
	}
	if k, seq, ok := chunkStart(ctx, js, bucket, info, offset); ok {
		chunk := objectChunkSize(info)
		r.StartChunk, r.StartByte = uint32(k), k*chunk
		ccfg.DeliverPolicy, ccfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, seq
	}
	if _, err := js.CreateConsumer(ctx, ObjectStream(bucket), ccfg); err != nil {
		return ObjectRead{}, fmt.Errorf("bus: consumer of object %s in %s: %w", object, bucket, err)
	}
	return r, nil
}

// chunkStart is the chunk k holding byte offset and its stream sequence,
// where both can be had by arithmetic (see CreateObjectRead); ok is false
// for offset 0 or when they cannot.
func chunkStart(ctx context.Context, js jetstream.JetStream, bucket string, info *jetstream.ObjectInfo, offset int64) (k int64, seq uint64, ok bool) {
	chunk := objectChunkSize(info)
	if offset <= 0 || offset >= int64(info.Size) || info.Chunks == 0 {
		return 0, 0, false
	}
	if k = offset / chunk; k == 0 || k >= int64(info.Chunks) {
		return 0, 0, false
	}
	str, err := js.Stream(ctx, ObjectStream(bucket))
	if err != nil {
		return 0, 0, false
	}
	last, err := str.GetLastMsgForSubject(ctx, ObjectChunks(bucket, info.NUID))
	if err != nil {
		return 0, 0, false
	}
	// nats.go's Put makes a chunk of each Read, so a chunk may be short.
	if int64(info.Chunks-1)*chunk+int64(len(last.Data)) != int64(info.Size) {
		return 0, 0, false
	}
	start := int64(last.Sequence) - int64(info.Chunks-1) + k
	if start < 1 {
		return 0, 0, false
	}
	return k, uint64(start), true
}

// objectChunkSize is the chunk size an object was stored with.
func objectChunkSize(info *jetstream.ObjectInfo) int64 {
	if info.Opts != nil && info.Opts.ChunkSize > 0 {
		return int64(info.Opts.ChunkSize)
	}
	return ObjectChunkSize
}
