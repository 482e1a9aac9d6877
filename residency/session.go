package residency

import (
	"context"
	"sync"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/residency/checkpoint"
)

// session is one residency on this host: one generation of one key.
type session struct {
	m   *Manager
	key Key
	gen uint64
	log *zap.Logger

	// op serialises attach, release and surrender of this residency. It is
	// a channel so a waiter can give up when its context ends.
	op chan struct{}

	// ctx scopes the heartbeat and warm goroutines of this residency.
	ctx    context.Context
	cancel context.CancelFunc

	mu        sync.Mutex
	ph        Phase
	lease     *lease
	fence     *fence
	state     SessionState
	workspace string
	workload  string
	consumer  *consumer
	// manifest is the workspace's last committed checkpoint (taken or
	// restored): the next one sends only what changed since.
	manifest *checkpoint.Manifest

	// cancelAttach cancels the attach in progress until it commits or a
	// drain cancels it (Manager.commit, Manager.cancelAttaches); under
	// Manager.mu.
	cancelAttach context.CancelCauseFunc

	hbCancel context.CancelFunc
	hbDone   chan struct{}

	warm       *warmWatch
	warmCancel context.CancelFunc
}

func newSession(m *Manager, key Key, gen uint64) *session {
	ctx, cancel := context.WithCancel(m.base)
	return &session{
		m: m, key: key, gen: gen, op: make(chan struct{}, 1), ctx: ctx, cancel: cancel, ph: PhaseAttaching,
		log: m.log.With(zap.Stringer("session", key), zap.Uint64("generation", gen)),
	}
}

// lock takes the op lock, or fails when ctx ends first.
func (s *session) lock(ctx context.Context) error {
	select {
	case s.op <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *session) unlock() { <-s.op }

func (s *session) phase() Phase {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ph
}

// transition applies e through the lifecycle table.
func (s *session) transition(e Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	next, err := s.ph.Next(e)
	if err != nil {
		return err
	}
	s.log.Debug("residency transition", zap.String("from", string(s.ph)), zap.String("event", string(e)), zap.String("to", string(next)))
	s.ph = next
	return nil
}

func (s *session) snapshot() Residency {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := Residency{
		Key: s.key, Host: s.m.o.HostID, Generation: s.gen, Phase: s.ph, Workload: s.workload, Workspace: s.workspace,
		Namespace: s.state.Namespace, CompatibilityID: s.m.o.Target.CompatibilityID,
	}
	if s.lease != nil {
		r.Epoch = s.lease.Epoch()
	}
	return r
}
