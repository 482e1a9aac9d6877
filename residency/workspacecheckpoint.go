package residency

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/residency/checkpoint"
	"github.com/warmfleet/warmfleet/schemas"
)

// CheckpointStores gives a session's checkpoint store as its holder at
// epoch reaches it (RemoteCheckpoints on a node).
type CheckpointStores func(key Key, epoch ResidencyEpoch) checkpoint.Store

// checkpoint takes the next checkpoint of the session (its workspace,
// when Options.Checkpoints is set) and commits it under the lease epoch;
// the caller holds the session's op lock. A holder that lost its grant
// commits nothing. kind says why, for Hooks.OnCheckpoint.
func (s *session) checkpoint(ctx context.Context, kind string) (Checkpoint, error) {
	m := s.m
	s.mu.Lock()
	cp := Checkpoint{
		Key: WireKey(s.key), Host: m.o.HostID, Epoch: s.lease.Epoch(), Sequence: s.state.CheckpointSequence + 1,
		CompatibilityID: m.o.Target.CompatibilityID, Namespace: s.state.Namespace,
	}
	s.mu.Unlock()
	if err := s.fence.Check(); err != nil {
		return cp, err
	}
	var (
		man *checkpoint.Manifest
		err error
	)
	if cp.Content, man, err = s.saveWorkspace(ctx, cp.Sequence, kind); err != nil {
		return cp, err
	}
	if err := s.fence.Check(); err != nil {
		return cp, err
	}
	if err := m.o.Durable.CommitCheckpoint(ctx, cp); err != nil {
		return cp, fmt.Errorf("checkpoint: %w", err)
	}
	s.mu.Lock()
	s.state.Exists, s.state.HasCheckpoint, s.state.CheckpointSequence = true, true, cp.Sequence
	s.state.CheckpointEpoch, s.state.Checkpoint = cp.Epoch, cp.Content
	if man != nil {
		// Only a committed manifest is the next take's previous one: the
		// chunks it names are kept while it is the latest, where those of
		// one never committed may be deleted with an older checkpoint.
		s.manifest = man
	}
	s.mu.Unlock()
	return cp, nil
}

// A session asks for a checkpoint by creating CheckpointRequestFile in its
// workspace. Its host notices within Options.CheckpointPoll, removes the
// file, takes and commits a checkpoint, then writes CheckpointDoneFile:
// the checkpoint's sequence, epoch and time, as JSON (CheckpointDone).
const (
	CheckpointRequestFile = ".warmfleet/checkpoint-request"
	CheckpointDoneFile    = ".warmfleet/checkpoint-done"
)

// CheckpointDone is what CheckpointDoneFile holds.
type CheckpointDone struct {
	Sequence uint64         `json:"sequence"`
	Epoch    ResidencyEpoch `json:"epoch"`
	TakenAt  time.Time      `json:"taken_at"`
}

// startCheckpoints checkpoints the resident session every
// Options.CheckpointInterval, so a node lost while it is resident costs
// at most that much of its workspace, and whenever the session asks. The
// loop ends with the residency.
func (s *session) startCheckpoints() {
	iv, poll := s.m.o.CheckpointInterval, s.m.o.CheckpointPoll
	if s.m.o.Checkpoints == nil {
		return
	}
	ctx := s.ctx
	s.m.spawn(func() {
		t := s.m.clock.NewTimer(poll)
		defer t.Stop()
		next := s.m.clock.Now().Add(iv)
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C():
			}
			asked := s.checkpointAsked()
			if asked || (iv > 0 && !s.m.clock.Now().Before(next)) {
				kind := "periodic"
				if asked {
					kind = "asked"
				}
				cp, err := s.checkpointResident(ctx, kind)
				switch {
				case err != nil && ctx.Err() == nil:
					s.log.Warn("checkpoint failed; the next one tries again", zap.Bool("asked", asked), zap.Error(err))
				case err == nil && asked && cp.Content != nil:
					s.answerAsked(cp)
				}
				next = s.m.clock.Now().Add(iv)
			}
			t.Reset(poll)
		}
	})
}

// checkpointAsked reports whether the session asked for a checkpoint,
// taking the request: one created meanwhile asks again.
func (s *session) checkpointAsked() bool {
	s.mu.Lock()
	dir := s.workspace
	s.mu.Unlock()
	return dir != "" && os.Remove(filepath.Join(dir, CheckpointRequestFile)) == nil
}

// answerAsked writes CheckpointDoneFile for checkpoint cp, whole or not
// at all.
func (s *session) answerAsked(cp Checkpoint) {
	s.mu.Lock()
	dir := s.workspace
	s.mu.Unlock()
	b, _ := json.Marshal(CheckpointDone{Sequence: cp.Sequence, Epoch: cp.Epoch, TakenAt: cp.Content.TakenAt})
	p := filepath.Join(dir, CheckpointDoneFile)
	tmp := p + ".tmp"
	if err := errors.Join(os.WriteFile(tmp, b, 0o644), os.Rename(tmp, p)); err != nil {
		s.log.Warn("checkpoint taken as asked, but its answer not written", zap.Uint64("sequence", cp.Sequence), zap.Error(err))
	}
}

// checkpointResident checkpoints the session if it is still resident,
// under its op lock (a release or surrender waits for it, and it for
// them). Inbox work goes on meanwhile: a file written during the take is
// caught as it was read.
func (s *session) checkpointResident(ctx context.Context, kind string) (Checkpoint, error) {
	if err := s.lock(ctx); err != nil {
		return Checkpoint{}, err
	}
	defer s.unlock()
	if s.phase() != PhaseResident {
		return Checkpoint{}, nil
	}
	return s.checkpoint(ctx, kind)
}

// saveWorkspace checkpoints the session's workspace as checkpoint
// (sequence, its epoch), sending only what the store lacks beside the
// session's last committed manifest, and returns what the commit records
// and the manifest taken. Without Options.Checkpoints it saves nothing
// (nil).
func (s *session) saveWorkspace(ctx context.Context, seq uint64, kind string) (*schemas.CheckpointSummary, *checkpoint.Manifest, error) {
	m := s.m
	if m.o.Checkpoints == nil {
		return nil, nil, nil
	}
	s.mu.Lock()
	dir, prev, epoch := s.workspace, s.manifest, s.lease.Epoch()
	s.mu.Unlock()
	start := m.clock.Now()
	id := checkpoint.ID{Sequence: seq, Epoch: uint64(epoch)}
	man, st, err := checkpoint.Take(ctx, dir, m.o.Checkpoints(s.key, epoch), id, checkpoint.Options{ChunkSize: m.o.CheckpointChunkSize, Previous: prev})
	m.o.Hooks.checkpointed(CheckpointEvent{Key: s.key, Kind: kind, Bytes: st.Bytes, Moved: st.BytesMoved, Duration: m.clock.Now().Sub(start), Err: err})
	if err != nil {
		return nil, nil, fmt.Errorf("checkpoint workspace: %w", err)
	}
	sum := &schemas.CheckpointSummary{TakenAt: start, Files: st.Files, Bytes: st.Bytes, BytesMoved: st.BytesMoved,
		Seconds: m.clock.Now().Sub(start).Seconds()}
	s.log.Info("workspace checkpointed", zap.Stringer("checkpoint", id), zap.Int("files", st.Files), zap.Int64("bytes", st.Bytes),
		zap.Int64("bytes_moved", st.BytesMoved), zap.Int("skipped", st.SkippedCount), zap.Duration("took", time.Duration(sum.Seconds*float64(time.Second))))
	return sum, &man, nil
}

// restoreWorkspace is step 5's second half: the workspace is restored from
// the latest checkpoint (or the kept one the request names) before the
// runtime starts. A session whose durable state records no workspace
// checkpoint starts empty, unless its target requires one.
func (a *attempt) restoreWorkspace(ctx context.Context) error {
	m, s := a.m, a.s
	s.mu.Lock()
	st, dir, epoch := s.state, s.workspace, s.lease.Epoch()
	s.mu.Unlock()
	if st.Checkpoint == nil || m.o.Checkpoints == nil {
		if a.req.FromCheckpoint != 0 {
			return fmt.Errorf("%w: from_checkpoint %d: %s keeps no workspace checkpoint", ErrInvalidRequest, a.req.FromCheckpoint, a.req.Key)
		}
		if m.o.Target.RequiresCheckpoint && a.req.Mode == ModeResume {
			return fmt.Errorf("%w: %s has no workspace checkpoint to restore (last committed: %d)", ErrCheckpointRequired, a.req.Key, st.CheckpointSequence)
		}
		return nil
	}
	point, err := restorePoint(st, a.req.FromCheckpoint)
	if err != nil {
		return err
	}
	id := checkpoint.ID{Sequence: point.Sequence, Epoch: uint64(point.Epoch)}
	start := m.clock.Now()
	man, rs, err := checkpoint.Restore(ctx, m.o.Checkpoints(a.req.Key, epoch), id, dir, 0)
	m.o.Hooks.checkpointed(CheckpointEvent{Key: a.req.Key, Kind: "restore", Bytes: rs.Bytes, Moved: rs.BytesFetched, Duration: m.clock.Now().Sub(start), Err: err})
	if err != nil {
		rerr := &RestoreError{Checkpoint: id, TakenAt: point.TakenAt, Cause: err}
		if errors.Is(err, checkpoint.ErrCorrupt) || errors.Is(err, checkpoint.ErrIncomplete) {
			for _, e := range st.EarlierCheckpoints {
				if e.Sequence < id.Sequence {
					rerr.Previous = e.Sequence
					break
				}
			}
		}
		return rerr
	}
	s.mu.Lock()
	s.manifest = &man
	s.mu.Unlock()
	a.restored = &point
	s.log.Info("workspace restored", zap.Stringer("checkpoint", id), zap.Uint64("latest", st.CheckpointSequence),
		zap.Int("files", rs.Files), zap.Int64("bytes", rs.Bytes))
	return nil
}

// restorePoint is the checkpoint an attach restores: the latest, with the
// time it was taken, or the kept one of sequence from (whose time the
// durable state does not hold).
func restorePoint(st SessionState, from uint64) (schemas.RestoredCheckpoint, error) {
	if from == 0 || from == st.CheckpointSequence {
		return schemas.RestoredCheckpoint{Sequence: st.CheckpointSequence, Epoch: st.CheckpointEpoch, TakenAt: st.Checkpoint.TakenAt}, nil
	}
	kept := []string{fmt.Sprint(st.CheckpointSequence)}
	for _, e := range st.EarlierCheckpoints {
		if e.Sequence == from {
			return schemas.RestoredCheckpoint{Sequence: e.Sequence, Epoch: e.Epoch}, nil
		}
		kept = append(kept, fmt.Sprint(e.Sequence))
	}
	return schemas.RestoredCheckpoint{}, fmt.Errorf("%w: from_checkpoint %d is not a kept workspace checkpoint (kept: %s)", ErrInvalidRequest, from, strings.Join(kept, ", "))
}

// RestoreError is a workspace checkpoint that could not be restored;
// nothing of it was put in place. Previous, when set, is the newest earlier
// checkpoint still kept, which an attach may restore instead
// (Request.FromCheckpoint) when this one is damaged.
type RestoreError struct {
	Checkpoint checkpoint.ID
	TakenAt    time.Time
	Previous   uint64
	Cause      error
}

func (e *RestoreError) Error() string {
	msg := "restore checkpoint " + e.Checkpoint.String()
	if !e.TakenAt.IsZero() {
		msg += " taken " + e.TakenAt.Format(time.RFC3339)
	}
	msg += ": " + e.Cause.Error()
	if e.Previous != 0 {
		msg += fmt.Sprintf("; checkpoint %d before it is kept: attach with from_checkpoint %d (warmfleet session attach --from-checkpoint %d) to restore it", e.Previous, e.Previous, e.Previous)
	}
	return msg
}

// Unwrap exposes the cause (a checkpoint code's sentinel).
func (e *RestoreError) Unwrap() error { return e.Cause }
