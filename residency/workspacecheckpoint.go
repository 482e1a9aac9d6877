package residency

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/residency/checkpoint"
	"github.com/warmfleet/warmfleet/schemas"
)

// CheckpointStores gives a session's checkpoint store as its holder at
// epoch reaches it (RemoteCheckpoints on a node).
type CheckpointStores func(key Key, epoch ResidencyEpoch) checkpoint.Store

// saveWorkspace checkpoints the session's workspace as checkpoint
// (sequence, its epoch), sending only what the store lacks beside the
// session's last manifest, and returns what the commit records. Without
// Options.Checkpoints it saves nothing (nil).
func (s *session) saveWorkspace(ctx context.Context, seq uint64) (*schemas.CheckpointSummary, error) {
	m := s.m
	if m.o.Checkpoints == nil {
		return nil, nil
	}
	s.mu.Lock()
	dir, prev, epoch := s.workspace, s.manifest, s.lease.Epoch()
	s.mu.Unlock()
	start := m.clock.Now()
	id := checkpoint.ID{Sequence: seq, Epoch: uint64(epoch)}
	man, st, err := checkpoint.Take(ctx, dir, m.o.Checkpoints(s.key, epoch), id, checkpoint.Options{ChunkSize: m.o.CheckpointChunkSize, Previous: prev})
	if err != nil {
		return nil, fmt.Errorf("checkpoint workspace: %w", err)
	}
	sum := &schemas.CheckpointSummary{TakenAt: start, Files: st.Files, Bytes: st.Bytes, BytesMoved: st.BytesMoved,
		Seconds: m.clock.Now().Sub(start).Seconds()}
	s.mu.Lock()
	s.manifest = &man
	s.mu.Unlock()
	s.log.Info("workspace checkpointed", zap.Stringer("checkpoint", id), zap.Int("files", st.Files), zap.Int64("bytes", st.Bytes),
		zap.Int64("bytes_moved", st.BytesMoved), zap.Int("skipped", st.SkippedCount), zap.Duration("took", time.Duration(sum.Seconds*float64(time.Second))))
	return sum, nil
}

// restoreWorkspace puts the session's latest checkpoint in its workspace
// before the runtime starts. A session whose durable state records no
// workspace checkpoint starts empty, unless its target requires one.
func (a *attempt) restoreWorkspace(ctx context.Context) error {
	m, s := a.m, a.s
	s.mu.Lock()
	st, dir, epoch := s.state, s.workspace, s.lease.Epoch()
	s.mu.Unlock()
	if st.Checkpoint == nil || m.o.Checkpoints == nil {
		if m.o.Target.RequiresCheckpoint && a.req.Mode == ModeResume {
			return fmt.Errorf("%w: %s has no workspace checkpoint to restore (last committed: %d)", ErrCheckpointRequired, a.req.Key, st.CheckpointSequence)
		}
		return nil
	}
	id := checkpoint.ID{Sequence: st.CheckpointSequence, Epoch: uint64(st.CheckpointEpoch)}
	man, rs, err := checkpoint.Restore(ctx, m.o.Checkpoints(a.req.Key, epoch), id, dir, 0)
	if err != nil {
		return fmt.Errorf("restore %s taken %s: %w", id, st.Checkpoint.TakenAt.Format(time.RFC3339), err)
	}
	s.mu.Lock()
	s.manifest = &man
	s.mu.Unlock()
	s.log.Info("workspace restored", zap.Stringer("checkpoint", id), zap.Time("taken_at", st.Checkpoint.TakenAt),
		zap.Int("files", rs.Files), zap.Int64("bytes", rs.Bytes))
	return nil
}
