package residency

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/schemas"
)

// DrainSwitch starts a drain on the admission ledger. The Manager's
// Admissions must implement it (Ledger does), so Drain flips the same flag
// every Admit and every published observation reads.
type DrainSwitch interface {
	BeginDrain()
}

// Principal is who an attach acts for.
type Principal struct {
	// TenantID must equal the session's tenant.
	TenantID string
	// ActorID is required: an attach nothing can be attributed to is refused.
	ActorID string
	// TraceID correlates the attach with its cause; optional.
	TraceID string
}

// Request asks for a session to be resident on this host.
type Request struct {
	Key  Key
	Mode Mode
	// CompatibilityID, when set, must equal the build this host launches;
	// a mis-placed session is refused before a lease is taken.
	CompatibilityID string
	Principal       Principal
	// GPUs are the cards the control plane booked to the session, by UUID,
	// and Devices their CDI devices, in the same order.
	GPUs    []string
	Devices []string
	// FromCheckpoint restores this kept checkpoint sequence instead of
	// the latest (0: the latest).
	FromCheckpoint uint64
}

// Residency describes one residency on this host.
type Residency struct {
	Key             Key
	Host            string
	Epoch           ResidencyEpoch
	Generation      uint64
	Phase           Phase
	Workload        string
	Workspace       string
	Namespace       string
	CompatibilityID string
	// Attached reports whether this call established the residency; false
	// means the session was already resident and the call took nothing.
	Attached bool
	// Restored is the workspace checkpoint the attach that returned this
	// restored; nil when it restored none.
	Restored *schemas.RestoredCheckpoint
}

// LostResidency is a residency surrendered because its grant was lost.
type LostResidency struct {
	Key        Key
	Host       string
	Epoch      ResidencyEpoch
	Generation uint64
	Workload   string
	Reason     error
}

// WarmOutcomeKind says how a warm countdown ended.
type WarmOutcomeKind string

// Warm outcomes.
const (
	WarmReleased   WarmOutcomeKind = "released"
	WarmAborted    WarmOutcomeKind = "aborted"    // runtime refused; still resident
	WarmNotIdle    WarmOutcomeKind = "not_idle"   // ConfirmIdle false at expiry
	WarmIncomplete WarmOutcomeKind = "incomplete" // released with teardowns left (see Err)
)

// WarmOutcome is one warm countdown's end.
type WarmOutcome struct {
	Key        Key
	Generation uint64
	Kind       WarmOutcomeKind
	Err        error
	// Failures are every step that did not succeed, in the order they ran
	// (for WarmAborted, the one the release stopped at); a caller branches
	// on their Steps, never on Err's text.
	Failures []WarmFailure
}

// WarmFailure is one step of a warm release that failed: "location",
// "inbox", "checkpoint" or "runtime" before the runtime went, "runtime",
// "location", "lease" or "workspace" after.
type WarmFailure struct {
	Step string
	Err  error
}

// WarmConfirmer re-confirms idleness at expiry, beyond what the inbox
// shows (e.g. a runtime reporting background work). Anything it cannot
// establish must be false.
type WarmConfirmer interface {
	ConfirmIdle(key Key) bool
}

// Hooks observe a Manager. Every field is optional; a hook must not block.
type Hooks struct {
	OnLost        func(LostResidency)
	OnWarmRelease func(WarmOutcome)
	// OnConsume reports the inbox consumer of a grant starting (true) and
	// stopping (false).
	OnConsume func(key Key, epoch ResidencyEpoch, consuming bool)
	// OnCheckpoint reports each workspace checkpoint taken or restored.
	OnCheckpoint func(CheckpointEvent)
}

// CheckpointEvent is one workspace checkpoint taken or restored.
type CheckpointEvent struct {
	Key Key
	// Kind is "release", "periodic", "asked" or "restore".
	Kind string
	// Bytes are the workspace's; Moved what crossed to or from the store;
	// Err why it failed (nil: it did).
	Bytes, Moved int64
	Duration     time.Duration
	Err          error
}

func (h Hooks) checkpointed(e CheckpointEvent) {
	if h.OnCheckpoint != nil {
		h.OnCheckpoint(e)
	}
}

func (h Hooks) consuming(k Key, e ResidencyEpoch, on bool) {
	if h.OnConsume != nil {
		h.OnConsume(k, e, on)
	}
}

// Options configures a Manager.
type Options struct {
	// HostID identifies this host as lease holder and in observations.
	HostID string
	Logger *zap.Logger
	Clock  Clock

	// Admissions is the host's one ledger; it must also be a DrainSwitch.
	Admissions Admissions
	// Leases and Locations are the control plane's services (see the
	// package doc); KVLeases and KVLocations implement them.
	Leases     SessionLeases
	Locations  Locations
	Durable    DurableStore
	Workspaces Workspaces
	Runtime    Runtime
	Target     RuntimeTarget
	Inboxes    Inboxes
	Handler    Handler
	// Checkpoints, when set, is where a release checkpoints the session's
	// workspace and an attach restores it from; nil keeps workspaces
	// local (a release then records a checkpoint without them).
	Checkpoints CheckpointStores
	// CheckpointChunkSize cuts files for Checkpoints (0: the checkpoint
	// package's default); it must fit what the store carries.
	CheckpointChunkSize int64
	// CheckpointInterval checkpoints each resident session that often,
	// beside the checkpoint of its release; zero takes none while it is
	// resident unless the session asks (CheckpointRequestFile), which is
	// looked for every CheckpointPoll (1 s when zero).
	CheckpointInterval time.Duration
	CheckpointPoll     time.Duration

	// WarmTTL is how long a session stays resident after its inbox goes
	// durably idle; zero disables warm release.
	WarmTTL time.Duration
	Confirm WarmConfirmer

	// HeartbeatInterval is how often the lease is renewed and the
	// observation republished; the grant's TTL/3 when zero.
	HeartbeatInterval time.Duration
	// FetchWait bounds one inbox pull; 100 ms when zero. It is also the
	// longest a halt waits for an idle consumer.
	FetchWait time.Duration
	// RetryDelay is the redelivery delay after a handler error; 1 s when zero.
	RetryDelay time.Duration
	// ReleaseBound bounds each teardown step (halting, runtime release,
	// compensations); 30 s when zero.
	ReleaseBound time.Duration

	Hooks Hooks
}

func (o *Options) validate() error {
	req := []struct {
		ok    bool
		field string
	}{
		{o.HostID != "", "HostID"},
		{o.Admissions != nil, "Admissions"},
		{o.Leases != nil, "Leases"},
		{o.Locations != nil, "Locations"},
		{o.Durable != nil, "Durable"},
		{o.Workspaces != nil, "Workspaces"},
		{o.Runtime != nil, "Runtime"},
		{o.Inboxes != nil, "Inboxes"},
		{o.Handler != nil, "Handler"},
	}
	for _, r := range req {
		if !r.ok {
			return &InvalidOptionsError{Field: r.field, Reason: "required"}
		}
	}
	if _, ok := o.Admissions.(DrainSwitch); !ok {
		return &InvalidOptionsError{Field: "Admissions", Reason: "must implement DrainSwitch (BeginDrain), so Drain and Draining share one flag"}
	}
	if o.WarmTTL < 0 || o.HeartbeatInterval < 0 || o.FetchWait < 0 || o.ReleaseBound < 0 || o.RetryDelay < 0 || o.CheckpointInterval < 0 || o.CheckpointPoll < 0 {
		return &InvalidOptionsError{Field: "durations", Reason: "must not be negative"}
	}
	if err := o.Target.validate(); err != nil {
		return err
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.Clock == nil {
		o.Clock = SystemClock{}
	}
	if o.FetchWait == 0 {
		o.FetchWait = 100 * time.Millisecond
	}
	if o.RetryDelay == 0 {
		o.RetryDelay = time.Second
	}
	if o.CheckpointPoll == 0 {
		o.CheckpointPoll = time.Second
	}
	if o.ReleaseBound == 0 {
		o.ReleaseBound = 30 * time.Second
	}
	return nil
}

// Manager keeps sessions resident on one host. It owns every goroutine it
// starts; Close stops them all.
type Manager struct {
	o     Options
	log   *zap.Logger
	clock Clock
	drain DrainSwitch

	base       context.Context
	cancelBase context.CancelFunc
	wg         sync.WaitGroup

	mu       sync.Mutex
	sessions map[Key]*session
	nextGen  uint64
	closed   bool
	inflight int
	settled  chan struct{} // closed while inflight == 0
}

// New validates o and returns a Manager.
func New(o Options) (*Manager, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	base, cancel := context.WithCancel(context.Background())
	settled := make(chan struct{})
	close(settled)
	return &Manager{
		o: o, log: o.Logger.With(zap.String("host", o.HostID)), clock: o.Clock,
		drain: o.Admissions.(DrainSwitch), base: base, cancelBase: cancel,
		sessions: make(map[Key]*session), settled: settled,
	}, nil
}

// spawn runs f on a goroutine the Manager owns, and reports false (running
// nothing) once the Manager is closed, so no goroutine starts after Close
// began waiting.
func (m *Manager) spawn(f func()) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		f()
	}()
	return true
}

// Resident returns the session's residency on this host, if any.
func (m *Manager) Resident(key Key) (Residency, bool) {
	m.mu.Lock()
	s, ok := m.sessions[key]
	m.mu.Unlock()
	if !ok {
		return Residency{}, false
	}
	return s.snapshot(), true
}

// Residencies lists every residency on this host.
func (m *Manager) Residencies() []Residency {
	m.mu.Lock()
	ss := make([]*session, 0, len(m.sessions))
	for _, s := range m.sessions {
		ss = append(ss, s)
	}
	m.mu.Unlock()
	out := make([]Residency, 0, len(ss))
	for _, s := range ss {
		out = append(out, s.snapshot())
	}
	return out
}

// Release releases a resident session gracefully: the same sequence as a
// warm release, without waiting for idleness.
func (m *Manager) Release(ctx context.Context, key Key) error {
	m.mu.Lock()
	s, ok := m.sessions[key]
	m.mu.Unlock()
	if !ok {
		return ErrNotResident
	}
	return s.release(ctx, "explicit")
}

// Close stops every goroutine as a process exit would: nothing is released
// or written, leases lapse at their expiry and runtimes stay where they are.
// Use Drain first for a graceful stop.
func (m *Manager) Close() {
	m.mu.Lock()
	m.closed = true
	ss := make([]*session, 0, len(m.sessions))
	for _, s := range m.sessions {
		ss = append(ss, s)
	}
	m.mu.Unlock()
	m.cancelBase()
	for _, s := range ss {
		s.mu.Lock()
		c, l := s.consumer, s.lease
		s.mu.Unlock()
		if c != nil {
			c.abort()
		}
		if l != nil {
			l.stopTimer()
		}
	}
	m.wg.Wait()
}

// reserve registers an attaching session, or says why not.
func (m *Manager) reserve(key Key) (s *session, existing *session, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, nil, ErrClosed
	}
	if cur, ok := m.sessions[key]; ok {
		if cur.phase() == PhaseResident {
			return nil, cur, nil
		}
		return nil, nil, errors.Join(ErrBusy, errors.New("residency: session is "+string(cur.phase())+" on this host"))
	}
	m.nextGen++
	s = newSession(m, key, m.nextGen)
	m.sessions[key] = s
	if m.inflight == 0 {
		m.settled = make(chan struct{})
	}
	m.inflight++
	return s, nil, nil
}

// arm makes s's attach cancellable by a drain until it commits. An attach
// armed after the drain cancelled the others is refused by the ledger at
// its admit step.
func (m *Manager) arm(s *session, cancel context.CancelCauseFunc) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s.cancelAttach = cancel
}

// commit is the point of no return of s's attach, running under actx:
// false if a drain cancelled it first; once true the drain releases the
// session instead of cancelling it.
func (m *Manager) commit(s *session, actx context.Context) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	s.cancelAttach = nil
	return !errors.Is(context.Cause(actx), errAttachDrained)
}

// cancelAttaches cancels every attach not yet committed.
func (m *Manager) cancelAttaches() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, s := range m.sessions {
		if s.cancelAttach != nil {
			s.cancelAttach(errAttachDrained)
			s.cancelAttach = nil
			n++
		}
	}
	return n
}

// settle ends an attach's in-flight count.
func (m *Manager) settle() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.inflight--
	if m.inflight == 0 {
		close(m.settled)
	}
}

// remove drops s from the registry if it is still the registered
// generation.
func (m *Manager) remove(s *session) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if cur, ok := m.sessions[s.key]; ok && cur == s {
		delete(m.sessions, s.key)
	}
}

func (m *Manager) lookup(key Key) (*session, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.sessions[key]
	return s, ok
}

// bounded is a context for a teardown step: not cancelled with the caller's
// request, bounded by ReleaseBound.
func (m *Manager) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), m.o.ReleaseBound)
}
