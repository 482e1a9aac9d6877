// Package runs is the one write path for a Run: every change is a
// lifecycle transition applied by CAS on wf_runs, with the events it
// produced stored in the Run's outbox by the same write and published to
// WF_EVENTS after it (outbox.go says how a missed publish is repaired).
package runs

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/cache"
	"github.com/warmfleet/warmfleet/controlplane/lifecycle"
	"github.com/warmfleet/warmfleet/schemas"
)

// Config tunes the store.
type Config struct {
	// DecisionCandidates bounds the full candidate entries a stored
	// decision keeps (schemas.BookingDecision.Compact).
	DecisionCandidates int
	// MaxAttempts is how many nodes a Run may be lost on before it ends lost.
	MaxAttempts int
	// Poke is called after a write that frees a booked place or returns a
	// Run to waiting, so the scheduler looks again.
	Poke func()
	Now  func() time.Time
}

// Store writes Runs.
type Store struct {
	cfg    Config
	kv     jetstream.KeyValue
	js     jetstream.JetStream
	cache  *cache.Cache
	log    *zap.Logger
	repair outboxRepair
	order  *publishOrder

	transitions atomic.Int64
	eventsSent  atomic.Int64
}

// NewStore returns a store over wf_runs (kv) and WF_EVENTS (through js).
func NewStore(kv jetstream.KeyValue, js jetstream.JetStream, c *cache.Cache, cfg Config, log *zap.Logger) *Store {
	return &Store{cfg: cfg, kv: kv, js: js, cache: c, log: log, order: newPublishOrder()}
}

// Transitions counts writes that changed a Run; EventsPublished counts
// event publishes, repairs that dedupe dropped included.
func (s *Store) Transitions() int64     { return s.transitions.Load() }
func (s *Store) EventsPublished() int64 { return s.eventsSent.Load() }

// noChange carries a transition's "nothing to write" to bus's CAS loop,
// which knows only bus.ErrNoChange; both stay visible to errors.Is.
type noChange struct{ err error }

func (e noChange) Error() string   { return e.err.Error() }
func (e noChange) Unwrap() []error { return []error{e.err, bus.ErrNoChange} }

// Advance applies t to the stored Run by CAS, then publishes the events it
// produced. It returns an error matching lifecycle.ErrNoChange (and
// bus.ErrNoChange) when t finds nothing to do; then nothing is published
// unless redelivered holds: the message that asked for t was delivered
// before, and its first handling may have stopped between an earlier write
// and its publish, so the Run's outbox is published again (Nats-Msg-Id keeps
// WF_EVENTS free of duplicates). A publish that fails after its write
// leaves the Run marked for RepairOutboxes. This replica's writes of one
// Run and their publishes happen one at a time (publishOrder).
func (s *Store) Advance(ctx context.Context, runID string, t lifecycle.Transition, redelivered bool) (schemas.Run, error) {
	defer s.order.lock(runID)()
	now := s.cfg.Now()
	var from schemas.Phase
	// The cached copy seeds the CAS: most writes then need no read first.
	run, rev, raw, err := bus.UpdateJSONFrom(ctx, s.kv, runID, s.cache.RunSeed(runID), func(r *schemas.Run) error {
		next, evs, err := t.Apply(*r)
		if err != nil {
			if errors.Is(err, lifecycle.ErrNoChange) {
				return noChange{err}
			}
			return err
		}
		from = r.Phase
		next.Outbox = nil
		// The attempts' records are stamped by the same write: when
		// one began to hold its place, the end and cost of one that ended.
		// An attempt's end is told before the phase it moves the Run to,
		// so a terminal phase stays the Run's last event.
		evs = append(lifecycle.Settle(&next, now), evs...)
		for _, ev := range evs {
			s.appendEvent(&next, ev, now)
		}
		if next.Phase != from {
			next.PhaseSince = now
		}
		next.UpdatedAt = now
		*r = next
		return nil
	})
	if err != nil && !errors.Is(err, lifecycle.ErrNoChange) {
		return run, fmt.Errorf("run %s: %w", runID, err)
	}
	if err == nil {
		s.cache.NoteRun(run, rev, raw)
		s.transitions.Add(1)
		if run.Phase != from && (run.Phase.Terminal() || run.Phase == schemas.PhaseAccepted || (run.Queued && run.Phase == schemas.PhaseLaunching)) {
			s.cfg.Poke() // a place freed, a Run to place, or a queued one's bytes there
		}
	} else if !redelivered {
		return run, err // the stored outbox was published by the change that wrote it
	}
	if perr := s.PublishEvents(ctx, run.TenantOf(), run.Outbox); perr != nil {
		if err == nil {
			s.repair.mark(runID, len(run.Outbox) > 1)
		}
		return run, perr
	}
	return run, err
}

// Create stores a new Run of tenant for req, submitted by identity, with
// its artifacts as the catalog resolved them, and publishes its accepted
// event. When first returns a transition, it is applied in the same write (intake's
// early decision). It reports true, with the stored Run, when the Run
// already existed.
func (s *Store) Create(ctx context.Context, tenant, identity string, req schemas.RunRequest, artifacts []schemas.ArtifactMount, pol Policy, first func(schemas.Run) lifecycle.Transition) (schemas.Run, bool, error) {
	now := s.cfg.Now()
	id := schemas.RunIDFor(tenant, req.RequestID)
	defer s.order.lock(id)()
	run := schemas.Run{
		ID: id, Tenant: tenant, SubmittedBy: identity, Request: req, Phase: schemas.PhaseAccepted,
		CreatedAt: now, UpdatedAt: now, PhaseSince: now, Artifacts: artifacts, Retry: pol.Retry, Spot: pol.Spot,
	}
	accepted := schemas.RunEvent{Type: schemas.EventAccepted, Phase: schemas.PhaseAccepted}
	var more []schemas.RunEvent
	if t := first(run); t != nil {
		if next, evs, err := t.Apply(run); err == nil {
			run = next
			more = foldDecision(&accepted, append(lifecycle.Settle(&run, now), evs...))
		}
	}
	s.appendEvent(&run, accepted, now)
	for _, ev := range more {
		s.appendEvent(&run, ev, now)
	}
	raw, rev, err := bus.CreateJSONRaw(ctx, s.kv, run.ID, &run)
	if errors.Is(err, jetstream.ErrKeyExists) {
		var stored schemas.Run
		if _, gerr := bus.GetJSON(ctx, s.kv, run.ID, &stored); gerr != nil {
			return run, false, fmt.Errorf("run %s: read existing: %w", run.ID, gerr)
		}
		return stored, true, nil
	}
	if err != nil {
		return run, false, fmt.Errorf("run %s: create: %w", run.ID, err)
	}
	s.cache.NoteRun(run, rev, raw)
	if err := s.PublishEvents(ctx, run.TenantOf(), run.Outbox); err != nil {
		// The submit is redelivered and repairs it as a duplicate; the
		// next pass repairs it too should the submit be gone.
		s.repair.mark(run.ID, len(run.Outbox) > 1)
		return run, false, err
	}
	return run, false, nil
}

// Policy is what intake resolved for a new Run from its request and its
// tenant's policy; the Run keeps it whatever the policy later says.
type Policy struct {
	Retry *schemas.RetryPolicy
	Spot  schemas.SpotPolicy
}

// foldDecision moves a decision made at intake that leaves the Run
// accepted (a wait) into its accepted event, and returns the events left.
// One event instead of two saves WF_EVENTS a stored message per Run, a
// quarter of intake's writes; the decision is recorded all the same.
func foldDecision(accepted *schemas.RunEvent, evs []schemas.RunEvent) []schemas.RunEvent {
	if len(evs) == 0 || evs[0].Type != schemas.EventDecided || evs[0].Phase != schemas.PhaseAccepted || evs[0].NodeID != "" {
		return evs
	}
	d := evs[0]
	accepted.Code, accepted.Message, accepted.Decision = d.Code, d.Message, d.Decision
	return evs[1:]
}

// Stored reads a Run from wf_runs; found is false when it is absent.
func (s *Store) Stored(ctx context.Context, runID string) (run schemas.Run, found bool, err error) {
	_, err = bus.GetJSON(ctx, s.kv, runID, &run)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return run, false, nil
	case err != nil:
		return run, false, fmt.Errorf("run %s: read: %w", runID, err)
	}
	return run, true, nil
}

// LoseAttempt ends r's current attempt as lost (lifecycle.Loss) for cause
// (node_lost, or interrupted when its machine was taken away).
func (s *Store) LoseAttempt(ctx context.Context, r schemas.Run, cause schemas.Code, why string, redelivered bool) (schemas.Run, error) {
	return s.Advance(ctx, r.ID, lifecycle.Loss{AttemptID: r.AttemptID, Why: why, MaxAttempts: s.cfg.MaxAttempts, Cause: cause}, redelivered)
}

// LoseAttempts ends the current attempt of each booked Run in rs (a
// waiting one is skipped) for cause, each for why(its node), and reports
// whether any Run changed.
func (s *Store) LoseAttempts(ctx context.Context, rs []*schemas.Run, cause schemas.Code, why func(nodeID string) string) bool {
	moved := false
	for _, r := range rs {
		if r.NodeID == "" || r.Phase == schemas.PhaseAccepted {
			continue
		}
		_, err := s.LoseAttempt(ctx, *r, cause, why(r.NodeID), false)
		switch {
		case err == nil:
			moved = true
		case !errors.Is(err, lifecycle.ErrNoChange):
			s.log.Warn("lose run attempt", zap.String("run_id", r.ID), zap.Error(err))
		}
	}
	return moved
}
