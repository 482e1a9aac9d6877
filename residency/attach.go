package residency

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/schemas"
)

// compensation undoes one attach step. name is what AttachError.Unreleased
// lists when it fails.
type compensation struct {
	name string
	undo func(context.Context) error
}

// attempt is one Attach in progress: the compensations owed so far.
type attempt struct {
	m     *Manager
	s     *session
	req   Request
	owed  []compensation
	stepN Step
	// restored is the checkpoint the workspace step restored, if any.
	restored *schemas.RestoredCheckpoint
}

func (a *attempt) owe(name string, undo func(context.Context) error) {
	a.owed = append(a.owed, compensation{name, undo})
}

// fail runs every compensation owed, newest first, and builds the error.
func (a *attempt) fail(ctx context.Context, step Step, cause error) error {
	e := &AttachError{Step: step, Code: codeFor(step, cause), Key: a.req.Key, Cause: cause}
	if e.Code == CodeRuntimeMismatch {
		e.RuntimeCompatibilityID = a.m.o.Target.CompatibilityID
	}
	cctx, cancel := a.m.bounded(ctx)
	defer cancel()
	for i := len(a.owed) - 1; i >= 0; i-- {
		c := a.owed[i]
		if err := c.undo(cctx); err != nil && !notOurs(err) {
			e.Unreleased = append(e.Unreleased, c.name)
			e.UnreleasedCauses = append(e.UnreleasedCauses, err)
		}
	}
	if a.s != nil {
		_ = a.s.transition(EventAttachFailed)
		a.s.cancel()
		a.m.remove(a.s)
	}
	log := a.m.log.With(zap.Stringer("session", a.req.Key), zap.Stringer("step", step), zap.String("code", string(e.Code)), zap.Error(cause))
	if len(e.Unreleased) > 0 {
		log.Error("attach failed and left resources held", zap.Strings("unreleased", e.Unreleased), zap.Errors("causes", e.UnreleasedCauses))
	} else {
		log.Info("attach refused; nothing held")
	}
	return e
}

// Attach makes the session resident on this host, in numbered steps (see
// Step). A failure at any step runs the compensations of the steps before it
// and returns an *AttachError naming every compensation that itself failed.
// A drain that begins before the last step commits the attach cancels it
// (code draining). A session already resident here returns Attached: false
// and takes nothing.
func (m *Manager) Attach(ctx context.Context, req Request) (Residency, error) {
	a := &attempt{m: m, req: req}

	// 1. validate, and reserve the key in the registry.
	if err := m.validate(req); err != nil {
		return Residency{}, a.fail(ctx, StepValidate, err)
	}
	s, existing, err := m.reserve(req.Key)
	if err != nil {
		return Residency{}, a.fail(ctx, StepValidate, err)
	}
	if existing != nil {
		r := existing.snapshot()
		r.Attached = false
		return r, nil
	}
	defer m.settle()
	a.s = s
	// A drain cancels the attach until it commits (Manager.commit); the
	// compensations still run under ctx.
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	m.arm(s, cancel)
	if err := s.lock(actx); err != nil {
		return Residency{}, a.fail(ctx, StepValidate, cancelled(actx, err))
	}
	defer s.unlock()

	for _, step := range []struct {
		n  Step
		do func(context.Context) error
	}{
		{StepAdmit, a.admit},
		{StepLease, a.acquire},
		{StepLoad, a.load},
		{StepWorkspace, a.workspace},
		{StepWorkspace, a.restoreWorkspace},
		{StepLaunch, a.launch},
		{StepAttaching, a.publishAttaching},
		{StepResident, a.publishResident},
		{StepConsume, a.consume},
	} {
		if err := step.do(actx); err != nil {
			return Residency{}, a.fail(ctx, step.n, cancelled(actx, err))
		}
	}
	if !m.commit(s, actx) {
		return Residency{}, a.fail(ctx, StepConsume, context.Cause(actx))
	}
	if err := s.transition(EventAttached); err != nil {
		return Residency{}, a.fail(ctx, StepConsume, err)
	}
	s.startWarm()
	s.startCheckpoints()
	r := s.snapshot()
	r.Attached, r.Restored = true, a.restored
	s.log.Info("session resident", zap.Uint64("epoch", uint64(r.Epoch)), zap.String("workload", r.Workload),
		zap.String("actor", req.Principal.ActorID), zap.String("trace", req.Principal.TraceID))
	return r, nil
}

// cancelled is err, with the reason the attach was cancelled (a drain's
// ErrDraining) when it was.
func cancelled(actx context.Context, err error) error {
	if cause := context.Cause(actx); actx.Err() != nil && cause != nil && !errors.Is(err, cause) {
		return fmt.Errorf("%w (%w)", cause, err)
	}
	return err
}

// validate is step 1's check of the request and its principal.
func (m *Manager) validate(req Request) error {
	if err := req.Key.Validate(); err != nil {
		return err
	}
	if req.Principal.ActorID == "" {
		return fmt.Errorf("%w: principal has no actor id", ErrInvalidRequest)
	}
	if req.Principal.TenantID != req.Key.Tenant {
		return fmt.Errorf("%w: principal of tenant %q may not attach a session of tenant %q", ErrForbidden, req.Principal.TenantID, req.Key.Tenant)
	}
	if req.Mode != ModeCreate && req.Mode != ModeResume {
		return fmt.Errorf("%w: mode %q is neither %q nor %q", ErrInvalidRequest, req.Mode, ModeCreate, ModeResume)
	}
	if req.FromCheckpoint != 0 && req.Mode != ModeResume {
		return fmt.Errorf("%w: from_checkpoint %d: only a resume restores a checkpoint", ErrInvalidRequest, req.FromCheckpoint)
	}
	if req.CompatibilityID != "" && req.CompatibilityID != m.o.Target.CompatibilityID {
		return fmt.Errorf("%w: request was placed for build %q", ErrRuntimeMismatch, req.CompatibilityID)
	}
	return nil
}

// 2. admit: charge the ledger and bind the charge to this generation.
func (a *attempt) admit(context.Context) error {
	adm := a.m.o.Admissions
	if err := adm.Admit(a.req.Key); err != nil {
		return err
	}
	if !adm.Own(a.req.Key, a.s.gen) {
		if !adm.Release(a.req.Key) {
			a.owe("admission", func(context.Context) error {
				return errors.New("residency: admission charge could not be bound or credited")
			})
		}
		return errors.New("residency: admission charge vanished before it could be owned")
	}
	a.owe("admission", func(context.Context) error {
		if !adm.ReleaseOwned(a.req.Key, a.s.gen) {
			return fmt.Errorf("residency: admission charge of %s generation %d not credited", a.req.Key, a.s.gen)
		}
		return nil
	})
	return nil
}

// 3. lease: acquire the grant, build its fence, start the heartbeat.
func (a *attempt) acquire(ctx context.Context) error {
	m, s := a.m, a.s
	l, err := acquireLease(ctx, m.o.Leases, m.clock, a.req.Key, m.o.HostID)
	var owed *LeaseCleanupError
	if errors.As(err, &owed) {
		a.owe("lease", owed.Release)
	}
	if err != nil {
		return err
	}
	f := newFence(a.req.Key, m.o.HostID, s.gen, l, m.o.Locations, m.clock, m.o.Admissions)
	s.mu.Lock()
	s.lease, s.fence = l, f
	s.log = s.log.With(zap.Uint64("epoch", uint64(l.Epoch())))
	s.mu.Unlock()
	s.startHeartbeat()
	a.owe("lease", func(ctx context.Context) error {
		s.stopHeartbeat()
		return l.release(ctx)
	})
	return nil
}

// 4. load: read the durable state and check it may be restored or created.
func (a *attempt) load(ctx context.Context) error {
	st, err := a.m.o.Durable.LoadSessionState(ctx, a.req.Key)
	if err != nil {
		return fmt.Errorf("residency: load durable state: %w", err)
	}
	if st.Namespace == "" {
		return ErrNamespaceMissing
	}
	target := a.m.o.Target.CompatibilityID
	switch a.req.Mode {
	case ModeResume:
		if !st.Exists {
			return ErrSessionNotFound
		}
		if st.CompatibilityID != target {
			return fmt.Errorf("%w: durable state written by %q, this host runs %q", ErrRuntimeMismatch, st.CompatibilityID, target)
		}
	case ModeCreate:
		if st.Exists {
			return ErrSessionExists
		}
		switch st.RuntimeJournal {
		case JournalEmpty:
		case JournalPresent:
			return fmt.Errorf("%w: the runtime journal already holds this session", ErrSessionExists)
		default:
			return ErrJournalUnknown
		}
	}
	a.s.mu.Lock()
	a.s.state = st
	a.s.mu.Unlock()
	return nil
}

// 5. workspace.
func (a *attempt) workspace(ctx context.Context) error {
	ws := a.m.o.Workspaces
	p, err := ws.EnsureWorkspace(ctx, a.req.Key)
	if err != nil {
		// It may have made part of the directory.
		a.owe("workspace", func(ctx context.Context) error { return ws.ReleaseWorkspace(ctx, a.req.Key) })
		return err
	}
	a.s.mu.Lock()
	a.s.workspace = p
	a.s.mu.Unlock()
	a.owe("workspace", func(ctx context.Context) error { return ws.ReleaseWorkspace(ctx, a.req.Key) })
	return nil
}

// 6. launch the runtime.
func (a *attempt) launch(ctx context.Context) error {
	m, s := a.m, a.s
	epoch := s.lease.Epoch()
	s.mu.Lock()
	spec := m.o.Target.spec(a.req.Key, m.o.HostID, epoch, s.workspace, s.state.Namespace)
	spec.Devices = a.req.Devices
	s.mu.Unlock()
	release := func(ctx context.Context) error { return releaseRuntime(ctx, m.o.Runtime, spec.ID, m.o.Target.grace()) }
	if err := launchRuntime(ctx, m.o.Runtime, spec); err != nil {
		// A launch that failed half-way may have left a container.
		a.owe("runtime", release)
		return err
	}
	a.owe("runtime", release)
	s.mu.Lock()
	s.workload = spec.ID
	s.mu.Unlock()
	s.fence.describe(spec, m.o.Target.CompatibilityID, s.state.Namespace, a.req.GPUs)
	return nil
}

// 7. publish `attaching`. The tombstone is owed before the write: a write
// whose answer was lost may still have landed.
func (a *attempt) publishAttaching(ctx context.Context) error {
	f := a.s.fence
	a.owe("location", f.tombstone)
	return f.publish(ctx, StateAttaching)
}

// 8. publish `resident`.
func (a *attempt) publishResident(ctx context.Context) error {
	return a.s.fence.publish(ctx, StateResident)
}

// 9. open the inbox and start consuming it.
func (a *attempt) consume(ctx context.Context) error {
	m, s := a.m, a.s
	in, err := m.o.Inboxes.OpenInbox(ctx, a.req.Key)
	if err != nil {
		return err
	}
	if err := s.fence.Check(); err != nil {
		return err
	}
	w := newWarmWatch()
	c := &consumer{
		key: a.req.Key, inbox: in, fence: s.fence, handler: m.o.Handler, wait: m.o.FetchWait, retry: m.o.RetryDelay,
		log: s.log.Named("inbox"), hooks: m.o.Hooks, onWork: w.woke, onIdle: w.idled, spawn: m.spawn, baseCtx: s.ctx,
	}
	s.mu.Lock()
	s.consumer, s.warm = c, w
	s.mu.Unlock()
	c.start()
	a.owe("inbox", func(context.Context) error { c.abort(); return nil })
	return nil
}
