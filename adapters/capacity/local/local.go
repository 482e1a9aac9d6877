// Package local is a capacity provider whose machines are agent processes on
// this host, each with its own containerd root: what `make run` and the
// tests rent from. Launching a machine is the Launcher's job, so tests can
// start in-process agents and a deployment can exec warmfleet-agent.
package local

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/schemas"
)

// Machine is one launched agent.
type Machine interface {
	// Stop ends the agent and releases what it holds.
	Stop(ctx context.Context) error
	// Done closes when the agent has exited for any reason.
	Done() <-chan struct{}
}

// Launcher starts an agent that enrolls with boot, delivered verbatim.
type Launcher func(ctx context.Context, name string, boot schemas.NodeBootstrap) (Machine, error)

// Offer is what the provider lists; every machine it launches has it.
type Offer = capacity.Offer

// Provider rents local machines.
type Provider struct {
	launch Launcher
	offer  capacity.Offer
	now    func() time.Time

	mu       sync.Mutex
	seq      int
	machines map[string]*machine // by native ref
	byKey    map[string]string   // operation key → native ref
}

type machine struct {
	owned    capacity.OwnedCapacity
	m        Machine
	state    capacity.State
	since    time.Time
	boot     schemas.NodeBootstrap
	stopping bool
}

// New returns a provider that launches machines with launch and lists offer
// (its ID, resources and price) as its only offer.
func New(launch Launcher, offer capacity.Offer) *Provider {
	if offer.ID == "" {
		offer.ID = "local"
	}
	offer.Provider, offer.Available = "local", true
	return &Provider{launch: launch, offer: offer, now: time.Now, machines: map[string]*machine{}, byKey: map[string]string{}}
}

// Support: local machines dedupe on the operation key and list what they
// own; they cannot be stopped and resumed (an agent's data dir is removed
// with it), so idle ones are terminated.
func (p *Provider) Support() capacity.Support {
	return capacity.Support{IdempotentProvision: capacity.IdempotencyOperationKey, ListOwned: true, ObserveAfterTerminate: true, ExactPricing: true}
}

// Declaration describes the adapter.
func (p *Provider) Declaration() capacity.Declaration {
	s := p.Support()
	return capacity.Declaration{Type: "local", Capacity: &s}
}

// Verify has nothing to check.
func (p *Provider) Verify(context.Context) error { return nil }

// ListCapacity lists the one offer when it matches.
func (p *Provider) ListCapacity(_ context.Context, q capacity.OfferQuery) ([]capacity.Offer, error) {
	if !q.Matches(p.offer) {
		return nil, nil
	}
	return []capacity.Offer{p.offer}, nil
}

// ProvisionCapacity launches a machine, once per operation key.
func (p *Provider) ProvisionCapacity(ctx context.Context, cmd capacity.ProvisionCommand) (capacity.Receipt, error) {
	if err := cmd.Validate(); err != nil {
		return capacity.Receipt{}, err
	}
	p.mu.Lock()
	if ref, ok := p.byKey[cmd.OperationKey]; ok {
		m := p.machines[ref]
		p.mu.Unlock()
		return capacity.Receipt{NativeRef: ref, State: m.state, AcceptedAt: m.owned.CreatedAt, Duplicate: true, Pricing: p.offer.PricePerHour}, nil
	}
	p.seq++
	ref := fmt.Sprintf("local-%d", p.seq)
	now := p.now()
	m := &machine{state: capacity.StateBooting, since: now, boot: cmd.Bootstrap, owned: capacity.OwnedCapacity{
		NativeRef: ref, ConnectionID: cmd.ConnectionID, RentalID: cmd.RentalID, Generation: cmd.Generation,
		OwnershipToken: cmd.OwnershipToken, OperationKey: cmd.OperationKey, State: capacity.StateBooting, CreatedAt: now}}
	p.machines[ref], p.byKey[cmd.OperationKey] = m, ref
	p.mu.Unlock()

	mach, err := p.launch(ctx, ref, cmd.Bootstrap)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		m.state, m.since = capacity.StateFailed, p.now()
		return capacity.Receipt{}, fmt.Errorf("local: launch %s: %w", ref, err)
	}
	m.m, m.state, m.since = mach, capacity.StateRunning, p.now()
	return capacity.Receipt{NativeRef: ref, State: capacity.StateRunning, AcceptedAt: now, Pricing: p.offer.PricePerHour}, nil
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
	return capacity.Observation{NativeRef: ref.NativeRef, State: m.state, ObservedAt: p.now(), StateSince: m.since}, nil
}

// StartCapacity and StopCapacity are not supported.
func (p *Provider) StartCapacity(context.Context, capacity.Command) (capacity.Receipt, error) {
	return capacity.Receipt{}, capacity.Errorf(capacity.CodeUnsupported, "local machines cannot be resumed")
}

func (p *Provider) StopCapacity(context.Context, capacity.Command) (capacity.Receipt, error) {
	return capacity.Receipt{}, capacity.Errorf(capacity.CodeUnsupported, "local machines cannot be stopped and resumed; terminate them")
}

// TerminateCapacity stops the machine's agent. It is idempotent.
func (p *Provider) TerminateCapacity(ctx context.Context, cmd capacity.Command) (capacity.Receipt, error) {
	if err := cmd.Validate(); err != nil {
		return capacity.Receipt{}, err
	}
	p.mu.Lock()
	m, ok := p.machines[cmd.NativeRef]
	if !ok || m.owned.OwnershipToken != cmd.OwnershipToken {
		p.mu.Unlock()
		return capacity.Receipt{}, capacity.Errorf(capacity.CodeNotFound, "no local machine %s", cmd.NativeRef)
	}
	if m.owned.Generation > cmd.Generation {
		p.mu.Unlock()
		return capacity.Receipt{}, capacity.Errorf(capacity.CodeStaleGeneration, "machine %s is at generation %d", cmd.NativeRef, m.owned.Generation)
	}
	if m.state == capacity.StateTerminated || m.stopping {
		p.mu.Unlock()
		return capacity.Receipt{NativeRef: cmd.NativeRef, State: capacity.StateTerminated, AcceptedAt: p.now(), Duplicate: true}, nil
	}
	m.stopping, m.state, m.since = true, capacity.StateTerminating, p.now()
	mach := m.m
	p.mu.Unlock()
	var err error
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
