package residency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"
)

// release releases a resident session gracefully, in order: mark releasing
// → halt consumption → checkpoint (the workspace, then its record) →
// release runtime → tombstone → drop the lease → drop local state. Halting
// first means no inbox work starts after the checkpoint. A failure up to
// and including the runtime release aborts back to resident under the same
// generation (unless the runtime is already gone, which cannot be undone);
// a failure after it is recorded in ReleaseError.Unwritten and the release
// goes on.
//
// why is for the log: "warm", "drain" or "explicit".
func (s *session) release(ctx context.Context, why string) error {
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.unlock()
	if err := s.transition(EventBeginRelease); err != nil {
		return fmt.Errorf("%w: %w", ErrNotResident, err)
	}
	m := s.m
	log := s.log.With(zap.String("why", why))
	log.Info("releasing session")

	// 1. mark releasing.
	if err := s.fence.publish(ctx, StateReleasing); err != nil {
		return s.abort(ctx, "location", fmt.Errorf("mark releasing: %w", err))
	}
	// 2. halt consumption.
	hctx, cancel := m.bounded(ctx)
	err := s.consumer.halt(hctx)
	cancel()
	if err != nil {
		return s.abort(ctx, "inbox", err)
	}
	// 3. checkpoint: the workspace, then the record naming it.
	cp, err := s.checkpoint(ctx, "release")
	if err != nil {
		return s.abort(ctx, "checkpoint", err)
	}
	// 4. release the runtime.
	rerr := &ReleaseError{Key: s.key}
	rctx, cancel := m.bounded(ctx)
	err = releaseRuntime(rctx, m.o.Runtime, s.workload, m.o.Target.grace())
	if err != nil && runtimeRunning(rctx, m.o.Runtime, s.workload) {
		cancel()
		return s.abort(ctx, "runtime", fmt.Errorf("runtime refused to release: %w", err))
	}
	cancel()
	if err != nil {
		rerr.add("runtime", err)
	}
	// 5. tombstone, after the heartbeat stopped republishing.
	s.stopHeartbeat()
	tctx, cancel := m.bounded(ctx)
	defer cancel()
	if err := s.fence.tombstone(tctx); err != nil && !notOurs(err) {
		rerr.add("location", err)
	}
	// 6. drop the lease.
	if err := s.lease.release(tctx); err != nil && !notOurs(err) {
		rerr.add("lease", err)
	}
	// 7. drop local state.
	if err := m.o.Workspaces.ReleaseWorkspace(tctx, s.key); err != nil {
		rerr.add("workspace", err)
	}
	if !m.o.Admissions.ReleaseOwned(s.key, s.gen) {
		log.Info("admission charge no longer this generation's; not credited")
	}
	s.stopWarm()
	_ = s.transition(EventReleased)
	m.remove(s)
	s.cancel()
	if len(rerr.Unwritten) > 0 {
		rerr.Cause = rerr.Causes[0]
		log.Error("session released with teardowns left", zap.Strings("unwritten", rerr.Unwritten), zap.Errors("causes", rerr.Causes))
		return rerr
	}
	log.Info("session released", zap.Uint64("checkpoint", cp.Sequence))
	return nil
}

func (e *ReleaseError) add(name string, err error) {
	e.Unwritten = append(e.Unwritten, name)
	e.Causes = append(e.Causes, err)
}

// abort returns a release that failed before the runtime went back to
// resident under the same generation: consumption resumes and `resident` is
// published again. With the grant gone it resumes nothing: the heartbeat's
// surrender, waiting for the op lock, owns that teardown.
func (s *session) abort(ctx context.Context, step string, cause error) error {
	_ = s.transition(EventAbortRelease)
	rerr := &ReleaseError{Key: s.key, Aborted: true, Step: step, Cause: cause}
	if s.fence.Check() != nil {
		s.log.Warn("release stopped: grant lost; surrender follows", zap.Error(cause))
		return rerr
	}
	s.consumer.resume()
	if err := s.fence.publish(ctx, StateResident); err != nil {
		// The heartbeat republishes the stored state; log and go on.
		s.log.Warn("abort could not republish resident", zap.Error(err))
	}
	s.log.Warn("release aborted; session resident again", zap.Error(cause))
	return rerr
}

// warmWatch carries the inbox consumer's signals to the warm countdown.
type warmWatch struct {
	wake chan struct{}
	idle chan struct{}
}

func newWarmWatch() *warmWatch {
	return &warmWatch{wake: make(chan struct{}, 1), idle: make(chan struct{}, 1)}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (w *warmWatch) woke()  { signal(w.wake) }
func (w *warmWatch) idled() { signal(w.idle) }

// startWarm starts the warm countdown of a resident session, if enabled.
func (s *session) startWarm() {
	if s.m.o.WarmTTL <= 0 {
		return
	}
	ctx, cancel := context.WithCancel(s.ctx)
	s.mu.Lock()
	s.warmCancel = cancel
	s.mu.Unlock()
	s.m.spawn(func() { s.warmLoop(ctx) })
}

// stopWarm cancels the countdown without waiting (it may be the caller).
func (s *session) stopWarm() {
	s.mu.Lock()
	cancel := s.warmCancel
	s.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// warmLoop arms a TTL countdown when the inbox is durably idle (an empty
// pull and no accepted, non-terminal work), cancels it on a wake (new work
// taken), and at expiry releases the session if it is still idle.
func (s *session) warmLoop(ctx context.Context) {
	m, w, c := s.m, s.warm, s.consumer
	var (
		timer   Timer
		armed   bool
		armedAt uint64
	)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		var fire <-chan time.Time
		if armed {
			fire = timer.C()
		}
		select {
		case <-ctx.Done():
			return
		case <-s.fence.Lost():
			return // surrender owns a lost grant
		case <-w.wake:
			if armed {
				timer.Stop()
				armed = false
				s.log.Debug("warm countdown cancelled by new work")
			}
		case <-w.idle:
			if armed {
				continue
			}
			accepted, err := c.inbox.AcceptedWork(ctx)
			if err != nil || accepted {
				continue
			}
			armedAt = c.activity.Load()
			if timer == nil {
				timer = m.clock.NewTimer(m.o.WarmTTL)
			} else {
				timer.Reset(m.o.WarmTTL)
			}
			armed = true
			s.log.Debug("warm countdown armed", zap.Duration("ttl", m.o.WarmTTL))
		case <-fire:
			armed = false
			if !s.confirmIdle(ctx, armedAt) {
				m.warmOutcome(WarmOutcome{Key: s.key, Generation: s.gen, Kind: WarmNotIdle})
				continue
			}
			rctx, cancel := m.bounded(ctx)
			err := s.release(rctx, "warm")
			cancel()
			switch {
			case err == nil:
				m.warmOutcome(WarmOutcome{Key: s.key, Generation: s.gen, Kind: WarmReleased})
				return
			case errors.Is(err, ErrReleaseAborted):
				m.warmOutcome(WarmOutcome{Key: s.key, Generation: s.gen, Kind: WarmAborted, Err: err, Failures: failuresOf(err)})
				if s.fence.Check() != nil {
					return
				}
			case errors.Is(err, ErrNotResident):
				return // released or lost by another path
			default:
				m.warmOutcome(WarmOutcome{Key: s.key, Generation: s.gen, Kind: WarmIncomplete, Err: err, Failures: failuresOf(err)})
				return
			}
		}
	}
}

// confirmIdle is the check at expiry: no message taken since arming, none in
// hand, nothing accepted in the inbox, and the optional WarmConfirmer agrees.
func (s *session) confirmIdle(ctx context.Context, armedAt uint64) bool {
	c := s.consumer
	if c.activity.Load() != armedAt || c.busy.Load() {
		return false
	}
	accepted, err := c.inbox.AcceptedWork(ctx)
	if err != nil || accepted {
		return false
	}
	if cf := s.m.o.Confirm; cf != nil && !cf.ConfirmIdle(s.key) {
		return false
	}
	return true
}

func (m *Manager) warmOutcome(o WarmOutcome) {
	if h := m.o.Hooks.OnWarmRelease; h != nil {
		h(o)
	}
}

// failuresOf lists a failed release's steps in the order they ran: the one
// an aborted release stopped at, or each teardown left unwritten.
func failuresOf(err error) []WarmFailure {
	var re *ReleaseError
	switch {
	case !errors.As(err, &re):
		return []WarmFailure{{Step: "release", Err: err}}
	case re.Aborted:
		return []WarmFailure{{Step: re.Step, Err: re.Cause}}
	}
	out := make([]WarmFailure, len(re.Unwritten))
	for i, step := range re.Unwritten {
		out[i] = WarmFailure{Step: step}
		if i < len(re.Causes) {
			out[i].Err = re.Causes[i]
		}
	}
	return out
}
