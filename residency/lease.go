package residency

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// ResidencyEpoch is a session's lease epoch: 1 for the first grant, +1 for
// every grant after an expiry. It is the fencing token of every residency
// write.
type ResidencyEpoch = schemas.ResidencyEpoch

// LeaseGrant is one grant of a session lease, as plain data so the
// SessionLeases interface can travel over request/reply; its Key is the
// wire key (KeyOf reads it).
type LeaseGrant = schemas.SessionLeaseGrant

// SessionLeases is the control plane's lease service, seen from a host.
// KVLeases implements it over wf_leases; a host in an agent would reach it
// over request/reply.
type SessionLeases interface {
	// AcquireSessionLease grants the lease to holder, or refuses with
	// ErrLeaseHeld while another holder's lease is live.
	AcquireSessionLease(ctx context.Context, key Key, holder string) (LeaseGrant, error)
	// RenewSessionLease extends the grant by its TTL with a CAS write at
	// the grant's revision. ErrLeaseLost when the record moved on or expired.
	RenewSessionLease(ctx context.Context, g LeaseGrant) (LeaseGrant, error)
	// ReleaseSessionLease CAS-writes an "expired now" record keeping the
	// epoch. ErrLeaseLost when the grant is not the current one any more.
	ReleaseSessionLease(ctx context.Context, g LeaseGrant) error
}

// LeaseCleanupError is an acquire that failed and may still have left the
// lease granted to the asker: a grant whose answer was lost, or one made
// before a later step of the acquire failed and could not be undone. The
// grant would otherwise block every attach of the session, the asker's own
// included, until its TTL ran out. The caller owes Release: Attach runs it
// among its compensations and names "lease" in AttachError.Unreleased if it
// fails, and errors.As on that AttachError reaches this value to retry.
type LeaseCleanupError struct {
	// Cause is the failure the acquire met, with the cleanup's own failure
	// joined where it already tried one.
	Cause error
	// Cleanup gives up whatever the acquire may have granted; nil is
	// nothing owed.
	Cleanup func(context.Context) error
}

func (e *LeaseCleanupError) Error() string {
	return "residency: lease acquire failed and may have left the lease granted: " + e.Cause.Error()
}

// Unwrap exposes the cause.
func (e *LeaseCleanupError) Unwrap() error { return e.Cause }

// Release runs Cleanup, if any.
func (e *LeaseCleanupError) Release(ctx context.Context) error {
	if e.Cleanup == nil {
		return nil
	}
	return e.Cleanup(ctx)
}

// lease is the host's view of one grant: it renews through SessionLeases and
// closes Lost when the grant is gone — a renewal conflict, or the local
// deadline passing without a successful renewal.
//
// The local deadline is the send time of the last successful renewal plus
// TTL minus a margin (TTL/5). It is earlier than the expiry the control
// plane wrote (which it stamped after receiving the request), so the holder
// stops before anyone else can acquire.
type lease struct {
	store SessionLeases
	clock Clock

	mu       sync.Mutex
	grant    LeaseGrant
	deadline time.Time
	timer    Timer
	released bool

	lost     chan struct{}
	lostOnce sync.Once
	reason   error
}

// leaseMargin is how long before the control plane's expiry the holder
// gives its grant up.
func leaseMargin(ttl time.Duration) time.Duration { return ttl / 5 }

func acquireLease(ctx context.Context, store SessionLeases, clock Clock, key Key, holder string) (*lease, error) {
	sent := clock.Now()
	g, err := store.AcquireSessionLease(ctx, key, holder)
	if err != nil {
		return nil, err
	}
	if g.Epoch == 0 || g.TTL <= 0 {
		return nil, errors.New("residency: lease store granted a zero epoch or TTL")
	}
	l := &lease{store: store, clock: clock, grant: g, lost: make(chan struct{})}
	l.mu.Lock()
	l.deadline = sent.Add(g.TTL - leaseMargin(g.TTL))
	l.timer = clock.AfterFunc(l.deadline.Sub(clock.Now()), l.expire)
	l.mu.Unlock()
	return l, nil
}

// expire runs at the local deadline; a renewal since then moved it.
func (l *lease) expire() {
	l.mu.Lock()
	due := !l.released && !l.clock.Now().Before(l.deadline)
	if !due && !l.released {
		l.timer.Reset(l.deadline.Sub(l.clock.Now()))
	}
	l.mu.Unlock()
	if due {
		l.markLost(ErrLeaseLost)
	}
}

func (l *lease) markLost(reason error) {
	l.lostOnce.Do(func() {
		l.mu.Lock()
		l.reason = reason
		if l.timer != nil {
			l.timer.Stop()
		}
		l.mu.Unlock()
		close(l.lost)
	})
}

// Epoch is the grant's epoch.
func (l *lease) Epoch() ResidencyEpoch {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.grant.Epoch
}

func (l *lease) TTL() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.grant.TTL
}

// Lost closes when the grant is no longer held.
func (l *lease) Lost() <-chan struct{} { return l.lost }

// valid reports nil while the grant is held by the local clock.
func (l *lease) valid() error {
	select {
	case <-l.lost:
		return ErrLeaseLost
	default:
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		return ErrLeaseLost
	}
	if !l.clock.Now().Before(l.deadline) {
		return ErrLeaseLost
	}
	return nil
}

// renew extends the grant. A refusal by the store closes Lost; a transport
// failure leaves the grant to the local deadline.
func (l *lease) renew(ctx context.Context) error {
	if err := l.valid(); err != nil {
		return err
	}
	l.mu.Lock()
	g := l.grant
	l.mu.Unlock()
	sent := l.clock.Now()
	ng, err := l.store.RenewSessionLease(ctx, g)
	if err != nil {
		if errors.Is(err, ErrLeaseLost) {
			l.markLost(err)
		}
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		return ErrLeaseLost
	}
	select {
	case <-l.lost:
		// Lost while the renewal travelled: the local deadline passed, and
		// the grant is not revived by a late answer.
		return ErrLeaseLost
	default:
	}
	l.grant = ng
	l.deadline = sent.Add(ng.TTL - leaseMargin(ng.TTL))
	l.timer.Reset(l.deadline.Sub(l.clock.Now()))
	return nil
}

// release drops the grant. A grant already lost owes nothing: the returned
// error then wraps ErrLeaseLost and the caller treats it as released.
func (l *lease) release(ctx context.Context) error {
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return nil
	}
	g := l.grant
	l.mu.Unlock()
	err := l.store.ReleaseSessionLease(ctx, g)
	if err != nil && !errors.Is(err, ErrLeaseLost) {
		return err
	}
	l.mu.Lock()
	l.released = true
	l.timer.Stop()
	l.mu.Unlock()
	return err
}

// stopTimer stops the local-deadline timer without releasing (Close).
func (l *lease) stopTimer() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.timer != nil {
		l.timer.Stop()
	}
}

// lostReason is why Lost closed (nil while held).
func (l *lease) lostReason() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reason
}
