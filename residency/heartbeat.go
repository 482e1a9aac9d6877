package residency

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"
)

// startHeartbeat runs the residency's heartbeat from the moment the lease is
// granted: the grant must be renewed through the rest of the attach too.
func (s *session) startHeartbeat() {
	ctx, cancel := context.WithCancel(s.ctx)
	done := make(chan struct{})
	s.mu.Lock()
	s.hbCancel, s.hbDone = cancel, done
	s.mu.Unlock()
	if !s.m.spawn(func() {
		defer close(done)
		s.heartbeat(ctx)
	}) {
		close(done)
	}
}

// stopHeartbeat ends the heartbeat and waits for it. It must not run on the
// heartbeat's own goroutine.
func (s *session) stopHeartbeat() {
	s.mu.Lock()
	cancel, done := s.hbCancel, s.hbDone
	s.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
}

func (s *session) interval() time.Duration {
	if s.m.o.HeartbeatInterval > 0 {
		return s.m.o.HeartbeatInterval
	}
	return s.lease.TTL() / 3
}

// heartbeat renews the lease and republishes the observation every
// interval, and surrenders when the grant is lost.
func (s *session) heartbeat(ctx context.Context) {
	every := s.interval()
	t := s.m.clock.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.fence.Lost():
			s.surrender(ctx)
			return
		case <-t.C():
			s.beat(ctx, every)
			t.Reset(every)
		}
	}
}

// beat is one heartbeat. Each call is bounded by the interval so a
// partitioned store cannot hold the heartbeat past the grant's deadline.
func (s *session) beat(ctx context.Context, bound time.Duration) {
	bctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	if err := s.lease.renew(bctx); err != nil {
		if ctx.Err() != nil {
			return // stopped mid-beat
		}
		if errors.Is(err, ErrLeaseLost) {
			s.log.Warn("lease renewal refused: grant lost", zap.Error(err))
			return
		}
		// Transient: the grant holds until its local deadline, and the
		// observation is still ours to republish until then.
		s.log.Warn("lease renewal failed; retrying until the grant's deadline", zap.Error(err))
	}
	if err := s.fence.republish(bctx); err != nil {
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, ErrEpochSuperseded) || errors.Is(err, ErrTombstoned) {
			s.log.Warn("republish refused: a later epoch holds the session", zap.Error(err))
		} else if !errors.Is(err, ErrStaleEpoch) {
			s.log.Warn("republish failed", zap.Error(err))
		}
	}
}

// surrender ends a residency whose grant is gone: stop consuming, tear the
// runtime down, drop local state, and credit the admission back only if the
// charge still belongs to this generation. It writes nothing to the lease;
// its only KV write, last, is a best-effort fenced tombstone of its own
// route, which the store refuses once a successor's epoch exists.
//
// It runs on the heartbeat goroutine. A release holding the op lock cancels
// the heartbeat's ctx before it waits for it, so surrender gives up the
// lock wait then; the release finishes the teardown itself.
func (s *session) surrender(ctx context.Context) {
	if err := s.lock(ctx); err != nil {
		return
	}
	defer s.unlock()
	if err := s.transition(EventLost); err != nil {
		return // released, or an attach that failed and compensated
	}
	m := s.m
	reason := s.lease.lostReason()
	s.log.Warn("grant lost; surrendering the session", zap.Error(reason))
	if c := s.consumer; c != nil {
		c.abort()
	}
	s.stopWarm()
	tctx, cancel := m.bounded(context.Background())
	defer cancel()
	s.mu.Lock()
	workload := s.workload
	s.mu.Unlock()
	if workload != "" {
		if err := releaseRuntime(tctx, m.o.Runtime, workload, m.o.Target.grace()); err != nil {
			s.log.Error("surrender could not tear the runtime down", zap.Error(err))
		}
	}
	if err := m.o.Workspaces.ReleaseWorkspace(tctx, s.key); err != nil {
		s.log.Error("surrender could not drop the workspace", zap.Error(err))
	}
	if !m.o.Admissions.ReleaseOwned(s.key, s.gen) {
		s.log.Info("admission charge no longer this generation's; not credited")
	}
	// Last, being the least needed: a successor's publish supersedes it.
	if s.fence.published() {
		if err := s.fence.tombstone(tctx); err != nil && !notOurs(err) {
			s.log.Info("surrender could not tombstone its route; the successor's publish supersedes it", zap.Error(err))
		}
	}
	m.remove(s)
	s.cancel()
	if h := m.o.Hooks.OnLost; h != nil {
		h(LostResidency{Key: s.key, Host: m.o.HostID, Epoch: s.lease.Epoch(), Generation: s.gen, Workload: workload, Reason: reason})
	}
}
