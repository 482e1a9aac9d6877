// Package local is a capacity provider whose machines are agent processes on
// this host: what `make run` and the tests rent from. Launching a machine is
// the Launcher's job, so tests can start in-process agents and a deployment
// can exec warmfleet-agent (ExecLauncher).
//
// ExecLauncher's machines each get a directory (bootstrap, agent data dir,
// log) and a containerd namespace of their own. With
// ExecConfig.ContainerdPerMachine (what `warmfleet serve --provider local`
// picks when it runs as root with containerd and runc installed) each also
// runs its own containerd daemon, root, state and socket under that
// directory, so machines share no image store: stop ends the agent and its
// daemon and keeps the directory (the images stay warm for the next start),
// terminate ends both and removes it. Without it every machine's agent uses
// one shared daemon, separated only by namespace.
package local

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/internal/randid"
	"github.com/warmfleet/warmfleet/schemas"
)

// Machine is one launched agent.
type Machine interface {
	// Stop ends the agent, if it runs, and releases what it holds (a
	// suspended machine's data dir too).
	Stop(ctx context.Context) error
	// Done closes when the agent process now running has exited for any
	// reason (after Resume, it is the new process's channel).
	Done() <-chan struct{}
}

// Suspendable is a Machine whose agent can be stopped keeping its data dir
// (saved session, operation journal, images, caches) and started again from
// it: what stop and resume of a local machine are.
type Suspendable interface {
	Machine
	// Suspend stops the agent process and keeps its data dir.
	Suspend(ctx context.Context) error
	// Resume starts the agent again from the data dir it kept.
	Resume(ctx context.Context) error
}

// Option tunes a Provider.
type Option func(*Provider)

// WithStopResume declares stop, resume and a persistent disk: the launcher's
// machines must be Suspendable (a provision whose machine is not fails).
func WithStopResume() Option { return func(p *Provider) { p.suspendable = true } }

// Launcher starts an agent that enrolls with boot, delivered verbatim.
type Launcher func(ctx context.Context, name string, boot schemas.NodeBootstrap) (Machine, error)

// Offer is what the provider lists; every machine it launches has it.
type Offer = capacity.Offer

// Provider rents local machines.
type Provider struct {
	launch Launcher
	offer  capacity.Offer
	// spot, when set, is a second, interruptible offer (WithSpotOffer).
	spot        *capacity.Offer
	now         func() time.Time
	suspendable bool
	// nonce makes native refs unique across providers (a restarted
	// control plane's provider never reuses an earlier one's refs).
	nonce string

	mu        sync.Mutex
	seq       int
	machines  map[string]*machine // by native ref
	byKey     map[string]string   // operation key → native ref
	rentalGen map[string]uint64   // highest generation seen per rental
}

type machine struct {
	// op serialises stop, start and terminate of this machine; it is taken
	// before Provider.mu, never while holding it.
	op    sync.Mutex
	owned capacity.OwnedCapacity
	m     Machine
	state capacity.State
	since time.Time
	boot  schemas.NodeBootstrap
	// offer is what the machine was rented as; interrupted that Interrupt
	// took it back.
	offer       capacity.Offer
	interrupted bool
}

// New returns a provider that launches machines with launch and lists offer
// (its ID, resources and price) as its only offer.
func New(launch Launcher, offer capacity.Offer, opts ...Option) *Provider {
	if offer.ID == "" {
		offer.ID = "local"
	}
	offer.Provider, offer.Available = "local", true
	p := &Provider{launch: launch, offer: offer, now: time.Now, nonce: randid.Hex("", 3), machines: map[string]*machine{}, byKey: map[string]string{},
		rentalGen: map[string]uint64{}}
	for _, o := range opts {
		o(p)
	}
	return p
}

// Support: local machines dedupe on the operation key, list what they own
// and refuse commands of a superseded generation. With WithStopResume they
// stop (the agent process ends, its data dir stays) and resume (the agent
// starts again from that data dir, still warm); without it idle ones can
// only be terminated.
func (p *Provider) Support() capacity.Support {
	// Machines live in this provider's memory: a control plane restarted
	// with a new provider finds its predecessor's machines not found, which
	// is why a terminated machine is not promised to stay observable.
	s := capacity.Support{IdempotentProvision: capacity.IdempotencyOperationKey, ListOwned: true, ObserveAfterTerminate: false,
		ExactPricing: true, GenerationFencing: true}
	if p.suspendable {
		s.Stop, s.Resume, s.PersistentDisk = true, true, true
	}
	s.Spot = p.spot != nil
	return s
}

// Declaration describes the adapter.
func (p *Provider) Declaration() capacity.Declaration {
	s := p.Support()
	return capacity.Declaration{Type: "local", Lane: capacity.LaneNodes, Capacity: &s}
}

// Verify has nothing to check.
func (p *Provider) Verify(context.Context) error { return nil }

// ListCapacity lists the offers that match: the on-demand one, and the
// spot one when there is one.
func (p *Provider) ListCapacity(_ context.Context, q capacity.OfferQuery) ([]capacity.Offer, error) {
	var out []capacity.Offer
	for _, o := range p.offers() {
		if q.Matches(o) {
			out = append(out, o)
		}
	}
	return out, nil
}

// ProvisionCapacity launches a machine, once per operation key. A
// provision for a rental under a generation older than one already seen is
// refused.
func (p *Provider) ProvisionCapacity(ctx context.Context, cmd capacity.ProvisionCommand) (capacity.Receipt, error) {
	if err := cmd.Validate(); err != nil {
		return capacity.Receipt{}, err
	}
	p.mu.Lock()
	if ref, ok := p.byKey[cmd.OperationKey]; ok {
		m := p.machines[ref]
		p.mu.Unlock()
		return capacity.Receipt{NativeRef: ref, State: m.state, AcceptedAt: m.owned.CreatedAt, Duplicate: true, Pricing: m.offer.PricePerHour, Interruptible: m.offer.Interruptible}, nil
	}
	if g := p.rentalGen[cmd.RentalID]; cmd.Generation < g {
		p.mu.Unlock()
		return capacity.Receipt{}, capacity.Errorf(capacity.CodeStaleGeneration, "rental %s is at generation %d", cmd.RentalID, g)
	}
	p.rentalGen[cmd.RentalID] = cmd.Generation
	p.seq++
	ref := fmt.Sprintf("local-%s-%d", p.nonce, p.seq)
	now := p.now()
	m := &machine{state: capacity.StateBooting, since: now, boot: cmd.Bootstrap, offer: p.offerFor(cmd), owned: capacity.OwnedCapacity{
		NativeRef: ref, ConnectionID: cmd.ConnectionID, RentalID: cmd.RentalID, Generation: cmd.Generation,
		OwnershipToken: cmd.OwnershipToken, OperationKey: cmd.OperationKey, State: capacity.StateBooting, CreatedAt: now}}
	p.machines[ref], p.byKey[cmd.OperationKey] = m, ref
	m.op.Lock() // nothing acts on the machine before it is launched
	p.mu.Unlock()
	defer m.op.Unlock()

	mach, err := p.launch(ctx, ref, cmd.Bootstrap)
	if err == nil && p.suspendable {
		if _, ok := mach.(Suspendable); !ok {
			err = errors.Join(fmt.Errorf("local: the launcher's machines cannot suspend, but the provider declares stop and resume"), mach.Stop(ctx))
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		m.state, m.since = capacity.StateFailed, p.now()
		return capacity.Receipt{}, fmt.Errorf("local: launch %s: %w", ref, err)
	}
	m.m, m.state, m.since = mach, capacity.StateRunning, p.now()
	return capacity.Receipt{NativeRef: ref, State: capacity.StateRunning, AcceptedAt: now, Pricing: m.offer.PricePerHour, Interruptible: m.offer.Interruptible}, nil
}

// ObserveCapacity reports a machine; one whose agent exited on its own is
// reported failed.
func (p *Provider) ObserveCapacity(_ context.Context, ref capacity.Ref) (capacity.Observation, error) {
	if err := ref.Validate(); err != nil {
		return capacity.Observation{}, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	m, ok := p.machines[ref.NativeRef]
	if !ok || m.owned.OwnershipToken != ref.OwnershipToken {
		return capacity.Observation{}, capacity.Errorf(capacity.CodeNotFound, "no local machine %s", ref.NativeRef)
	}
	if m.m != nil && m.state == capacity.StateRunning {
		select {
		case <-m.m.Done():
			m.state, m.since = capacity.StateFailed, p.now()
		default:
		}
	}
	return capacity.Observation{NativeRef: ref.NativeRef, State: m.state, ObservedAt: p.now(), StateSince: m.since, Interrupted: m.interrupted}, nil
}

// acquire finds the machine a command names, serialises it against other
// commands on that machine, and fences the command's generation: an older
// one is refused, a newer one becomes the machine's. The caller unlocks
// m.op.
func (p *Provider) acquire(cmd capacity.Command) (*machine, error) {
	if err := cmd.Validate(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	m, ok := p.machines[cmd.NativeRef]
	p.mu.Unlock()
	if !ok || m.owned.OwnershipToken != cmd.OwnershipToken {
		return nil, capacity.Errorf(capacity.CodeNotFound, "no local machine %s", cmd.NativeRef)
	}
	m.op.Lock()
	p.mu.Lock()
	defer p.mu.Unlock()
	if m.owned.Generation > cmd.Generation {
		m.op.Unlock()
		return nil, capacity.Errorf(capacity.CodeStaleGeneration, "machine %s is at generation %d", cmd.NativeRef, m.owned.Generation)
	}
	m.owned.Generation = cmd.Generation
	p.rentalGen[m.owned.RentalID] = max(p.rentalGen[m.owned.RentalID], cmd.Generation)
	return m, nil
}

// powerChange is one stop or start of a machine: it runs from one state,
// through another while act works, to a third; a machine already at the
// last answers as a duplicate, and one that fails lands on onFail.
type powerChange struct {
	verb                   string
	from, during, to, fail capacity.State
	act                    func(Suspendable, context.Context) error
}

var (
	stopMachine = powerChange{verb: "stop", from: capacity.StateRunning, during: capacity.StateStopping,
		to: capacity.StateStopped, fail: capacity.StateFailed, act: Suspendable.Suspend}
	startMachine = powerChange{verb: "start", from: capacity.StateStopped, during: capacity.StateBooting,
		to: capacity.StateRunning, fail: capacity.StateStopped, act: Suspendable.Resume}
)

// StopCapacity ends a running machine's agent and keeps its data dir.
func (p *Provider) StopCapacity(ctx context.Context, cmd capacity.Command) (capacity.Receipt, error) {
	return p.changePower(ctx, cmd, stopMachine)
}

// StartCapacity starts a stopped machine's agent again from its data dir.
func (p *Provider) StartCapacity(ctx context.Context, cmd capacity.Command) (capacity.Receipt, error) {
	return p.changePower(ctx, cmd, startMachine)
}

func (p *Provider) changePower(ctx context.Context, cmd capacity.Command, c powerChange) (capacity.Receipt, error) {
	if !p.suspendable {
		return capacity.Receipt{}, capacity.Errorf(capacity.CodeUnsupported, "these local machines cannot be stopped and resumed; terminate them")
	}
	m, err := p.acquire(cmd)
	if err != nil {
		return capacity.Receipt{}, err
	}
	defer m.op.Unlock()
	p.mu.Lock()
	switch m.state {
	case c.to:
		defer p.mu.Unlock()
		return capacity.Receipt{NativeRef: cmd.NativeRef, State: m.state, AcceptedAt: p.now(), Duplicate: true, Pricing: m.offer.PricePerHour, Interruptible: m.offer.Interruptible}, nil
	case c.from:
	default:
		defer p.mu.Unlock()
		return capacity.Receipt{}, capacity.Errorf(capacity.CodeInvalid, "machine %s is %s", cmd.NativeRef, m.state)
	}
	accepted := p.now()
	m.state, m.since = c.during, accepted
	mach := m.m.(Suspendable)
	p.mu.Unlock()
	err = c.act(mach, ctx)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		m.state, m.since = c.fail, p.now()
		return capacity.Receipt{}, fmt.Errorf("local: %s %s: %w", c.verb, cmd.NativeRef, err)
	}
	m.state, m.since = c.to, p.now()
	return capacity.Receipt{NativeRef: cmd.NativeRef, State: m.state, AcceptedAt: accepted, Pricing: m.offer.PricePerHour, Interruptible: m.offer.Interruptible}, nil
}

// TerminateCapacity stops the machine's agent and releases what it holds.
// It is idempotent.
func (p *Provider) TerminateCapacity(ctx context.Context, cmd capacity.Command) (capacity.Receipt, error) {
	m, err := p.acquire(cmd)
	if err != nil {
		return capacity.Receipt{}, err
	}
	defer m.op.Unlock()
	p.mu.Lock()
	if m.state == capacity.StateTerminated {
		defer p.mu.Unlock()
		return capacity.Receipt{NativeRef: cmd.NativeRef, State: capacity.StateTerminated, AcceptedAt: p.now(), Duplicate: true}, nil
	}
	m.state, m.since = capacity.StateTerminating, p.now()
	mach := m.m
	p.mu.Unlock()
	if mach != nil {
		err = mach.Stop(ctx)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	m.state, m.since = capacity.StateTerminated, p.now()
	return capacity.Receipt{NativeRef: cmd.NativeRef, State: capacity.StateTerminated, AcceptedAt: m.since}, err
}

// ListOwnedCapacity lists machines carrying the query's ownership token.
func (p *Provider) ListOwnedCapacity(_ context.Context, q capacity.OwnershipQuery) ([]capacity.OwnedCapacity, error) {
	if err := q.Validate(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []capacity.OwnedCapacity
	for _, m := range p.machines {
		if m.owned.OwnershipToken != q.OwnershipToken || (q.RentalID != "" && m.owned.RentalID != q.RentalID) || m.state == capacity.StateTerminated {
			continue
		}
		o := m.owned
		o.State = m.state
		out = append(out, o)
	}
	return out, nil
}

// Shutdown terminates every machine this provider launched: a local
// machine does not outlive the control plane that rented it (its agent
// would otherwise keep running, unknown to the next one). Run it after the
// control plane has stopped.
func (p *Provider) Shutdown(ctx context.Context) error {
	p.mu.Lock()
	var ms []*machine
	for _, m := range p.machines {
		ms = append(ms, m)
	}
	p.mu.Unlock()
	var errs []error
	for _, m := range ms {
		m.op.Lock()
		p.mu.Lock()
		mach, gone := m.m, m.state == capacity.StateTerminated
		if !gone {
			m.state, m.since = capacity.StateTerminating, p.now()
		}
		p.mu.Unlock()
		if !gone && mach != nil {
			if err := mach.Stop(ctx); err != nil {
				errs = append(errs, fmt.Errorf("local: stop %s: %w", m.owned.NativeRef, err))
			}
		}
		p.mu.Lock()
		m.state, m.since = capacity.StateTerminated, p.now()
		p.mu.Unlock()
		m.op.Unlock()
	}
	return errors.Join(errs...)
}

// Bootstrap returns what the machine with ref was given, for tests that
// check it was delivered verbatim.
func (p *Provider) Bootstrap(ref string) (schemas.NodeBootstrap, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m, ok := p.machines[ref]
	if !ok {
		return schemas.NodeBootstrap{}, false
	}
	return m.boot, true
}

// Launched counts machines ever provisioned.
func (p *Provider) Launched() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.machines)
}
