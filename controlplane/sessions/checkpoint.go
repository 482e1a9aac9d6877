package sessions

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/controlplane/requests"
	"github.com/warmfleet/warmfleet/residency"
	"github.com/warmfleet/warmfleet/residency/checkpoint"
	"github.com/warmfleet/warmfleet/schemas"
)

// checkpoints serves a session's checkpoint operations (schemas'
// ResidencyChunk… and ResidencyRecord…) over the wf_checkpoints bucket, to
// the node that holds the session's lease at the request's epoch and to no
// other: a node that lost the lease, or any other node, is refused
// residency.ErrNotLeaseHolder before anything is read or written.
type checkpoints struct {
	leases *residency.KVLeases
	bucket *checkpoint.ObjectBucket
	now    func() time.Time
}

func (c *checkpoints) endpoints(log *zap.Logger) []requests.Endpoint {
	serve := func(op schemas.ResidencyOp, answer func(ctx context.Context, s *checkpoint.ObjectStore, req schemas.CheckpointRequest) (schemas.CheckpointContent, error)) requests.Endpoint {
		return residencyServerIn(op, "CheckpointRequest", false, func(ctx context.Context, node string, req schemas.CheckpointRequest) (schemas.CheckpointContent, error) {
			s, err := c.store(ctx, node, op, req)
			if err != nil {
				return schemas.CheckpointContent{}, err
			}
			return answer(ctx, s, req)
		}, log)
	}
	return []requests.Endpoint{
		serve(schemas.ResidencyChunkHas, func(ctx context.Context, s *checkpoint.ObjectStore, req schemas.CheckpointRequest) (schemas.CheckpointContent, error) {
			has, err := s.HasChunk(ctx, req.Digest)
			return schemas.CheckpointContent{Has: has}, err
		}),
		serve(schemas.ResidencyChunkPut, func(ctx context.Context, s *checkpoint.ObjectStore, req schemas.CheckpointRequest) (schemas.CheckpointContent, error) {
			return schemas.CheckpointContent{}, s.PutChunk(ctx, req.Digest, checkpoint.Chunk{Data: req.Data, Compressed: req.Compressed})
		}),
		serve(schemas.ResidencyChunkGet, func(ctx context.Context, s *checkpoint.ObjectStore, req schemas.CheckpointRequest) (schemas.CheckpointContent, error) {
			ch, err := s.GetChunk(ctx, req.Digest)
			return schemas.CheckpointContent{Data: ch.Data, Compressed: ch.Compressed}, err
		}),
		serve(schemas.ResidencyRecordPut, func(ctx context.Context, s *checkpoint.ObjectStore, req schemas.CheckpointRequest) (schemas.CheckpointContent, error) {
			return schemas.CheckpointContent{}, s.PutManifest(ctx, checkpoint.ID{Sequence: req.Sequence, Epoch: req.RecordEpoch}, req.Data)
		}),
		serve(schemas.ResidencyRecordGet, func(ctx context.Context, s *checkpoint.ObjectStore, req schemas.CheckpointRequest) (schemas.CheckpointContent, error) {
			b, err := s.GetManifest(ctx, checkpoint.ID{Sequence: req.Sequence, Epoch: req.RecordEpoch})
			return schemas.CheckpointContent{Data: b}, err
		}),
	}
}

// forget deletes checkpoints drop of the session and the chunks only they
// named, once a commit pushed them out of those the session keeps. A
// failure leaves their content in the bucket, and is logged.
func (c *checkpoints) forget(ctx context.Context, key residency.Key, drop, keep []schemas.CheckpointRef, log *zap.Logger) {
	s, err := c.bucket.Session(key.Tenant, key.Session)
	if err == nil {
		var st checkpoint.PruneStats
		st, err = checkpoint.Forget(ctx, s, ids(drop), ids(keep))
		log.Debug("old checkpoints deleted", zap.Stringer("session", key), zap.Int("checkpoints", st.Manifests), zap.Int("chunks", st.Chunks))
	}
	if err != nil && ctx.Err() == nil {
		log.Warn("old checkpoints not deleted; their content stays in the bucket", zap.Stringer("session", key), zap.Error(err))
	}
}

func ids(refs []schemas.CheckpointRef) []checkpoint.ID {
	out := make([]checkpoint.ID, len(refs))
	for i, r := range refs {
		out[i] = checkpoint.ID{Sequence: r.Sequence, Epoch: uint64(r.Epoch)}
	}
	return out
}

// store is the session's checkpoint store, once node is found to hold the
// session's live lease at req.Epoch and req names a chunk or a checkpoint
// as op needs.
func (c *checkpoints) store(ctx context.Context, node string, op schemas.ResidencyOp, req schemas.CheckpointRequest) (*checkpoint.ObjectStore, error) {
	key := residency.KeyOf(req.Key)
	if err := key.Validate(); err != nil {
		return nil, err
	}
	switch op {
	case schemas.ResidencyRecordPut, schemas.ResidencyRecordGet:
		if req.Sequence == 0 || req.RecordEpoch == 0 {
			return nil, fmt.Errorf("%w: sequence and record_epoch: a checkpoint's, each from 1", residency.ErrInvalidRequest)
		}
		if op == schemas.ResidencyRecordPut && req.RecordEpoch != uint64(req.Epoch) {
			return nil, fmt.Errorf("%w: record_epoch %d: a holder writes checkpoints of its own epoch, %d", residency.ErrInvalidRequest, req.RecordEpoch, req.Epoch)
		}
	default:
		if !checkpoint.ValidDigest(req.Digest) {
			return nil, fmt.Errorf("%w: digest: a chunk's lowercase hex SHA-256", residency.ErrInvalidRequest)
		}
	}
	rec, _, err := c.leases.Get(ctx, key)
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, err
	}
	if err != nil || rec.Holder != node || rec.Released || rec.Epoch != req.Epoch || !rec.Live(c.now()) {
		return nil, fmt.Errorf("%w: node %s does not hold %s's lease at epoch %d: only the holder reads or writes its checkpoints", residency.ErrNotLeaseHolder, node, key, req.Epoch)
	}
	return c.bucket.Session(key.Tenant, key.Session)
}
