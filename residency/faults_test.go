package residency

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/warmfleet/warmfleet/noderuntime"
)

// errInjected is every injected failure.
var errInjected = errors.New("injected failure")

// faults names operations that fail. Names are "<interface>.<op>", e.g.
// "leases.acquire", "locations.publish.resident", "runtime.remove".
type faults struct {
	mu   sync.Mutex
	set  map[string]bool
	errs map[string]error // a fault that fails with this error instead
	// launchGate, when set, holds every Launch until it is closed; each
	// Launch it holds sends on atGate, when set, first.
	launchGate chan struct{}
	atGate     chan struct{}
}

func newFaults() *faults { return &faults{set: map[string]bool{}, errs: map[string]error{}} }

func (f *faults) injectErr(name string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errs[name] = err
}

func (f *faults) inject(names ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, n := range names {
		f.set[n] = true
	}
}

// replace makes names the only faults, at once: no operation runs between
// the old set and the new.
func (f *faults) replace(names ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.set, f.errs = map[string]bool{}, map[string]error{}
	for _, n := range names {
		f.set[n] = true
	}
}

func (f *faults) clear() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.set = map[string]bool{}
	f.errs = map[string]error{}
}

func (f *faults) check(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.errs[name]; err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if f.set[name] {
		return fmt.Errorf("%s: %w", name, errInjected)
	}
	return nil
}

type faultyAdmissions struct {
	*Ledger
	f *faults
}

func (a faultyAdmissions) Admit(k Key) error {
	if err := a.f.check("admissions.admit"); err != nil {
		return err
	}
	return a.Ledger.Admit(k)
}

func (a faultyAdmissions) ReleaseOwned(k Key, gen uint64) bool {
	if a.f.check("admissions.release") != nil {
		return false
	}
	return a.Ledger.ReleaseOwned(k, gen)
}

// link is a host's connection to the control plane's lease and location
// services. Cut, a call fails at once but its request stays "in flight":
// Heal delivers it late to the real store and records the answer, as a
// delayed packet would.
type link struct {
	mu     sync.Mutex
	cut    bool
	flight []lateCall
}

type lateCall struct {
	op string
	do func(context.Context) error
}

// lateResult is the answer the store gave a request delivered late.
type lateResult struct {
	op  string
	err error
}

var errPartitioned = errors.New("partitioned from the control plane")

func (l *link) call(ctx context.Context, op string, do func(context.Context) error) error {
	l.mu.Lock()
	if !l.cut {
		l.mu.Unlock()
		return do(ctx)
	}
	l.flight = append(l.flight, lateCall{op, do})
	l.mu.Unlock()
	return fmt.Errorf("%s: %w", op, errPartitioned)
}

func (l *link) partition() {
	l.mu.Lock()
	l.cut = true
	l.mu.Unlock()
}

// heal delivers every request sent while cut, in order, and reconnects.
func (l *link) heal(ctx context.Context) []lateResult {
	l.mu.Lock()
	flight := l.flight
	l.flight, l.cut = nil, false
	l.mu.Unlock()
	out := make([]lateResult, 0, len(flight))
	for _, c := range flight {
		out = append(out, lateResult{c.op, c.do(ctx)})
	}
	return out
}

type hostLeases struct {
	SessionLeases
	l *link
	f *faults
}

func (h hostLeases) AcquireSessionLease(ctx context.Context, key Key, holder string) (LeaseGrant, error) {
	if err := h.f.check("leases.acquire"); err != nil {
		return LeaseGrant{}, err
	}
	var g LeaseGrant
	err := h.l.call(ctx, "acquire", func(ctx context.Context) error {
		var err error
		g, err = h.SessionLeases.AcquireSessionLease(ctx, key, holder)
		return err
	})
	if err == nil && h.f.check("leases.acquire.lost") != nil {
		// Granted, and the answer lost: the refusal owes the grant back.
		return LeaseGrant{}, &LeaseCleanupError{Cause: errInjected, Cleanup: func(ctx context.Context) error { return h.ReleaseSessionLease(ctx, g) }}
	}
	return g, err
}

func (h hostLeases) RenewSessionLease(ctx context.Context, g LeaseGrant) (LeaseGrant, error) {
	var ng LeaseGrant
	err := h.l.call(ctx, "renew", func(ctx context.Context) error {
		var err error
		ng, err = h.SessionLeases.RenewSessionLease(ctx, g)
		return err
	})
	return ng, err
}

func (h hostLeases) ReleaseSessionLease(ctx context.Context, g LeaseGrant) error {
	if err := h.f.check("leases.release"); err != nil {
		return err
	}
	return h.l.call(ctx, "release", func(ctx context.Context) error { return h.SessionLeases.ReleaseSessionLease(ctx, g) })
}

type hostLocations struct {
	Locations
	l *link
	f *faults
}

func (h hostLocations) PublishResidency(ctx context.Context, o Observation) error {
	if err := h.f.check("locations.publish." + string(o.State)); err != nil {
		return err
	}
	return h.l.call(ctx, "publish."+string(o.State), func(ctx context.Context) error { return h.Locations.PublishResidency(ctx, o) })
}

func (h hostLocations) TombstoneResidency(ctx context.Context, key Key, host string, epoch ResidencyEpoch) error {
	if err := h.f.check("locations.tombstone"); err != nil {
		return err
	}
	return h.l.call(ctx, "tombstone", func(ctx context.Context) error { return h.Locations.TombstoneResidency(ctx, key, host, epoch) })
}

type faultyDurable struct {
	DurableStore
	f *faults
}

func (d faultyDurable) LoadSessionState(ctx context.Context, key Key) (SessionState, error) {
	if err := d.f.check("durable.load"); err != nil {
		return SessionState{}, err
	}
	return d.DurableStore.LoadSessionState(ctx, key)
}

func (d faultyDurable) CommitCheckpoint(ctx context.Context, cp Checkpoint) error {
	if err := d.f.check("durable.checkpoint"); err != nil {
		return err
	}
	return d.DurableStore.CommitCheckpoint(ctx, cp)
}

type faultyWorkspaces struct {
	Workspaces
	f *faults
}

func (w faultyWorkspaces) EnsureWorkspace(ctx context.Context, key Key) (string, error) {
	if err := w.f.check("workspaces.ensure"); err != nil {
		return "", err
	}
	return w.Workspaces.EnsureWorkspace(ctx, key)
}

func (w faultyWorkspaces) ReleaseWorkspace(ctx context.Context, key Key) error {
	if err := w.f.check("workspaces.release"); err != nil {
		return err
	}
	return w.Workspaces.ReleaseWorkspace(ctx, key)
}

type faultyRuntime struct {
	Runtime
	f *faults
}

func (r faultyRuntime) Launch(ctx context.Context, spec noderuntime.WorkloadSpec) (noderuntime.WorkloadStatus, error) {
	r.f.mu.Lock()
	gate, atGate := r.f.launchGate, r.f.atGate
	r.f.mu.Unlock()
	if gate != nil {
		if atGate != nil {
			atGate <- struct{}{}
		}
		select {
		case <-gate:
		case <-ctx.Done():
			return noderuntime.WorkloadStatus{}, ctx.Err()
		}
	}
	if err := r.f.check("runtime.launch"); err != nil {
		return noderuntime.WorkloadStatus{}, err
	}
	return r.Runtime.Launch(ctx, spec)
}

func (r faultyRuntime) Stop(ctx context.Context, id string, grace time.Duration) error {
	if err := r.f.check("runtime.stop"); err != nil {
		return err
	}
	if err := r.f.check("runtime.stop:" + id); err != nil {
		return err
	}
	return r.Runtime.Stop(ctx, id, grace)
}

func (r faultyRuntime) Remove(ctx context.Context, id string) error {
	if err := r.f.check("runtime.remove"); err != nil {
		return err
	}
	return r.Runtime.Remove(ctx, id)
}

type faultyInboxes struct {
	Inboxes
	f *faults
}

func (i faultyInboxes) OpenInbox(ctx context.Context, key Key) (Inbox, error) {
	if err := i.f.check("inboxes.open"); err != nil {
		return nil, err
	}
	return i.Inboxes.OpenInbox(ctx, key)
}
