package residency

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"

	"go.uber.org/zap"
)

// ErrDrainIncomplete is Drain's error when some session could not be
// released; DrainReport.Failures says which and why.
var ErrDrainIncomplete = errors.New("residency: drain incomplete")

// errAttachDrained is why a drain cancels an attach not yet committed.
var errAttachDrained = fmt.Errorf("%w: the attach was cancelled before it committed", ErrDraining)

// DrainReport is what a drain did.
type DrainReport struct {
	// Released were released gracefully by this drain.
	Released []Key
	// Gone were released or lost by another path while the drain ran.
	Gone []Key
	// Failures could not be released cleanly: an aborted release leaves the
	// session resident; an incomplete one names what is still held.
	Failures []*ReleaseError
}

// Drain stops new admissions at once (the ledger answers Draining() true
// for every Admit and every published observation from now on), cancels
// every attach not yet committed and waits for their compensations, then
// releases every resident session gracefully and reports what could not be
// released.
func (m *Manager) Drain(ctx context.Context) (DrainReport, error) {
	m.drain.BeginDrain()
	cancelled := m.cancelAttaches()
	m.log.Info("draining", zap.Int("attaches_cancelled", cancelled))

	// Stop advertising accepting now rather than at the next heartbeat.
	for _, s := range m.live() {
		if f := s.fenceOf(); f != nil {
			if err := f.republish(ctx); err != nil {
				s.log.Info("drain could not republish not-accepting", zap.Error(err))
			}
		}
	}
	m.mu.Lock()
	settled := m.settled
	m.mu.Unlock()
	select {
	case <-settled:
	case <-ctx.Done():
		return DrainReport{}, fmt.Errorf("%w: attaches in flight: %w", ErrDrainIncomplete, ctx.Err())
	}

	var (
		mu  sync.Mutex
		rep DrainReport
		wg  sync.WaitGroup
	)
	for _, s := range m.live() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := s.release(ctx, "drain")
			mu.Lock()
			defer mu.Unlock()
			var rerr *ReleaseError
			switch {
			case err == nil:
				rep.Released = append(rep.Released, s.key)
			case errors.Is(err, ErrNotResident):
				rep.Gone = append(rep.Gone, s.key)
			case errors.As(err, &rerr):
				rep.Failures = append(rep.Failures, rerr)
			default:
				rep.Failures = append(rep.Failures, &ReleaseError{Key: s.key, Aborted: s.phase() == PhaseResident, Cause: err})
			}
		}()
	}
	wg.Wait()
	sortKeys(rep.Released)
	sortKeys(rep.Gone)
	sort.Slice(rep.Failures, func(i, j int) bool { return rep.Failures[i].Key.String() < rep.Failures[j].Key.String() })
	if len(rep.Failures) > 0 {
		errs := []error{ErrDrainIncomplete}
		for _, f := range rep.Failures {
			errs = append(errs, f)
		}
		return rep, errors.Join(errs...)
	}
	m.log.Info("drained", zap.Int("released", len(rep.Released)))
	return rep, nil
}

// live lists the registered sessions.
func (m *Manager) live() []*session {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*session, 0, len(m.sessions))
	for _, s := range m.sessions {
		out = append(out, s)
	}
	return out
}

func (s *session) fenceOf() *fence {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fence
}

func sortKeys(ks []Key) {
	sort.Slice(ks, func(i, j int) bool { return ks[i].String() < ks[j].String() })
}
