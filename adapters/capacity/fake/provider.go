// Package fake is a deterministic capacity provider: a simulated world,
// driven by a seed and a virtual clock, that misbehaves the way real
// providers do (stock-outs, spot interruptions, lost responses, duplicate
// deliveries, rate limits) and records every allocation so tests can assert
// that nothing was ever allocated twice.
package fake

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity"
)

// Type is the adapter type string.
const Type = "fake"

// Provider is the fake world and its adapter in one: it implements
// capacity.Provider. Safe for concurrent use; deterministic for a given
// seed when called sequentially.
type Provider struct {
	cfg     Config
	support capacity.Support
	clock   Clock

	mu          sync.Mutex
	rng         *rand.Rand
	seq         int
	machines    map[string]*machine // by native ref, never forgotten
	byKey       map[string]*machine // provider-side dedupe (operation_key mode)
	rentalGen   map[string]uint64   // highest generation seen per rental
	allocations []Allocation
	trace       []string
}

var (
	_ capacity.Provider = (*Provider)(nil)
	_ capacity.Declarer = (*Provider)(nil)
)

// New returns a fake world shaped by cfg.
func New(cfg Config) (*Provider, error) {
	support := DefaultSupport()
	if cfg.Support != nil {
		support = *cfg.Support
	}
	if err := support.Validate(); err != nil {
		return nil, fmt.Errorf("fake: %w", err)
	}
	if cfg.Offers == nil {
		cfg.Offers = DefaultOffers()
	}
	clock := cfg.Clock
	if clock == nil {
		clock = NewManualClock(epoch())
	}
	return &Provider{
		cfg: cfg, support: support, clock: clock,
		// Two PCG words from one seed: the second only decorrelates streams.
		rng:       rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		machines:  map[string]*machine{},
		byKey:     map[string]*machine{},
		rentalGen: map[string]uint64{},
	}, nil
}

// Support reports what this world was configured to do.
func (p *Provider) Support() capacity.Support { return p.support }

// Declaration states the adapter type and its capacity support.
func (p *Provider) Declaration() capacity.Declaration {
	s := p.support
	return capacity.Declaration{Type: Type, Lane: capacity.LaneNodes, Capacity: &s}
}

// Verify fails only when credentials are configured to be refused.
func (p *Provider) Verify(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	_, err := p.enter("verify")
	return err
}

// ListCapacity filters the catalogue.
func (p *Provider) ListCapacity(ctx context.Context, q capacity.OfferQuery) ([]capacity.Offer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, err := p.enter("list_capacity"); err != nil {
		return nil, err
	}
	var out []capacity.Offer
	for _, o := range p.cfg.Offers {
		if !p.support.Spot && o.Interruptible {
			continue
		}
		o.PricePerHour.Exact = p.support.ExactPricing
		if o.ReadySeconds == 0 {
			o.ReadySeconds = int64((p.cfg.Latency.Provision + p.cfg.Latency.Boot) / time.Second)
		}
		if q.Matches(o) {
			out = append(out, o)
		}
	}
	return out, nil
}

// ProvisionCapacity allocates a machine, or answers with the one this
// OperationKey already allocated.
func (p *Provider) ProvisionCapacity(ctx context.Context, cmd capacity.ProvisionCommand) (capacity.Receipt, error) {
	if err := cmd.Validate(); err != nil {
		return capacity.Receipt{}, p.wrap(err, "provision", cmd.RentalID)
	}
	if err := ctx.Err(); err != nil {
		return capacity.Receipt{}, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now, err := p.enter("provision")
	if err != nil {
		return capacity.Receipt{}, err
	}
	deliveries := 1
	if p.chance(p.cfg.Faults.DuplicateDelivery) {
		deliveries = 2
	}
	var rec capacity.Receipt
	for range deliveries {
		if rec, err = p.provisionOnce(now, cmd); err != nil {
			return capacity.Receipt{}, err
		}
	}
	if p.chance(p.cfg.Faults.LostResponse) {
		p.tracef("provision %s -> lost", cmd.OperationKey)
		return capacity.Receipt{}, ErrResponseLost
	}
	return rec, nil
}

func (p *Provider) provisionOnce(now time.Time, cmd capacity.ProvisionCommand) (capacity.Receipt, error) {
	if m := p.existing(now, cmd); m != nil {
		// A key reused for a different request is the caller's bug, not a
		// retry: answering the first machine would hide it.
		if cmd.RequestHash != "" && m.reqHash != "" && cmd.RequestHash != m.reqHash {
			return capacity.Receipt{}, p.fail(capacity.CodeInvalid, "provision", cmd.RentalID,
				"operation key "+cmd.OperationKey+" was first used for a different request")
		}
		p.tracef("provision %s -> duplicate %s", cmd.OperationKey, m.ref)
		return p.receipt(m, now, true), nil
	}
	if p.support.GenerationFencing && cmd.Generation < p.rentalGen[cmd.RentalID] {
		return capacity.Receipt{}, p.fail(capacity.CodeStaleGeneration, "provision", cmd.RentalID,
			fmt.Sprintf("generation %d is older than %d", cmd.Generation, p.rentalGen[cmd.RentalID]))
	}
	i := slices.IndexFunc(p.cfg.Offers, func(o capacity.Offer) bool { return o.ID == cmd.OfferID })
	if i < 0 {
		return capacity.Receipt{}, p.fail(capacity.CodeInvalid, "provision", cmd.RentalID, "no offer "+cmd.OfferID)
	}
	offer := p.cfg.Offers[i]
	if !offer.Available || p.chance(p.cfg.Faults.StockOut) {
		return capacity.Receipt{}, p.fail(capacity.CodeOutOfStock, "provision", cmd.RentalID, "no stock for "+offer.ID)
	}
	// The machine receives the bootstrap's JSON as its user data, as a real
	// provider would hand it to cloud-init: encoded once, never interpreted.
	userData, err := json.Marshal(cmd.Bootstrap)
	if err != nil {
		return capacity.Receipt{}, p.fail(capacity.CodeInvalid, "provision", cmd.RentalID, "bootstrap does not encode")
	}
	p.seq++
	m := &machine{
		ref: fmt.Sprintf("fk-%06d", p.seq), rental: cmd.RentalID, owner: cmd.OwnershipToken, opKey: cmd.OperationKey,
		reqHash: cmd.RequestHash, generation: cmd.Generation, offer: offer, userData: userData, createdAt: now,
		interruptible: p.support.Spot && (cmd.Interruptible || offer.Interruptible),
		endpoint:      fmt.Sprintf("10.%d.%d.%d", p.seq>>16&0xff, p.seq>>8&0xff, p.seq&0xff),
	}
	booting := now.Add(p.jitter(p.cfg.Latency.Provision))
	running := booting.Add(p.jitter(p.cfg.Latency.Boot))
	m.plan(now, capacity.StateProvisioning,
		transition{booting, capacity.StateBooting}, transition{running, capacity.StateRunning})
	if m.interruptible && p.chance(p.cfg.Faults.SpotInterruption) {
		within := p.cfg.Faults.SpotInterruptWithin
		if within <= 0 {
			within = time.Hour
		}
		m.reclaimAt(running.Add(time.Duration(p.rng.Int64N(int64(within)))), true)
	}
	if p.support.MaxLifetime && cmd.MaxLifetimeSeconds > 0 {
		m.reclaimAt(now.Add(time.Duration(cmd.MaxLifetimeSeconds)*time.Second), false)
	}
	m.advance(now)
	p.machines[m.ref] = m
	p.byKey[cmd.OperationKey] = m
	p.rentalGen[cmd.RentalID] = max(p.rentalGen[cmd.RentalID], cmd.Generation)
	p.allocations = append(p.allocations, Allocation{
		NativeRef: m.ref, RentalID: m.rental, OperationKey: m.opKey, Generation: m.generation,
		OfferID: offer.ID, Interruptible: m.interruptible, At: now,
	})
	p.tracef("provision %s -> allocated %s", cmd.OperationKey, m.ref)
	return p.receipt(m, now, false), nil
}

// existing finds the machine an OperationKey already allocated: by the
// provider's own key index, or, without one, the way an adapter must, by
// looking through the owned machines that still exist.
func (p *Provider) existing(now time.Time, cmd capacity.ProvisionCommand) *machine {
	if p.support.IdempotentProvision == capacity.IdempotencyOperationKey {
		return p.byKey[cmd.OperationKey]
	}
	for _, ref := range p.sortedRefs() {
		m := p.machines[ref]
		m.advance(now)
		if m.owner == cmd.OwnershipToken && m.opKey == cmd.OperationKey && m.state != capacity.StateTerminated {
			return m
		}
	}
	return nil
}

func (p *Provider) receipt(m *machine, now time.Time, dup bool) capacity.Receipt {
	price := m.offer.PricePerHour
	price.Exact = p.support.ExactPricing
	return capacity.Receipt{NativeRef: m.ref, State: m.state, AcceptedAt: now, Duplicate: dup,
		Interruptible: m.interruptible, Pricing: price}
}

// ObserveCapacity reports a machine's state on its own timeline.
func (p *Provider) ObserveCapacity(ctx context.Context, ref capacity.Ref) (capacity.Observation, error) {
	if err := ref.Validate(); err != nil {
		return capacity.Observation{}, p.wrap(err, "observe", ref.NativeRef)
	}
	if err := ctx.Err(); err != nil {
		return capacity.Observation{}, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now, err := p.enter("observe")
	if err != nil {
		return capacity.Observation{}, err
	}
	m, err := p.lookup("observe", ref)
	if err != nil {
		return capacity.Observation{}, err
	}
	m.advance(now)
	if m.state == capacity.StateTerminated && !p.support.ObserveAfterTerminate {
		return capacity.Observation{}, p.fail(capacity.CodeNotFound, "observe", ref.NativeRef, "terminated and forgotten")
	}
	obs := capacity.Observation{NativeRef: m.ref, State: m.state, ObservedAt: now, StateSince: m.since, Interrupted: m.interrupted}
	if m.state == capacity.StateRunning {
		obs.Endpoint = m.endpoint
	}
	native, _ := json.Marshal(map[string]any{
		"id": m.ref, "offer": m.offer.ID, "state": m.state, "since": m.since, "generation": m.generation,
		"interruptible": m.interruptible, "created_at": m.createdAt,
	})
	obs.NativeJSON = string(native)
	return obs, nil
}

// lookup finds a machine of ours; a machine carrying another ownership
// token is reported not found, never acted on.
func (p *Provider) lookup(op string, ref capacity.Ref) (*machine, error) {
	m := p.machines[ref.NativeRef]
	if m == nil || m.owner != ref.OwnershipToken {
		return nil, p.fail(capacity.CodeNotFound, op, ref.NativeRef, "no machine of ours by that ref")
	}
	return m, nil
}

// fence refuses a command older than the machine's generation and raises
// the machine's generation to a newer command's.
func (p *Provider) fence(op string, m *machine, cmd capacity.Command) error {
	if !p.support.GenerationFencing {
		return nil
	}
	if cmd.Generation < m.generation {
		return p.fail(capacity.CodeStaleGeneration, op, m.ref,
			fmt.Sprintf("generation %d is older than the machine's %d", cmd.Generation, m.generation))
	}
	m.generation = cmd.Generation
	p.rentalGen[m.rental] = max(p.rentalGen[m.rental], cmd.Generation)
	return nil
}

// mutate runs a start, stop or terminate: validation, entry, lookup,
// fencing, then apply, then perhaps lose the response.
func (p *Provider) mutate(ctx context.Context, op string, cmd capacity.Command,
	apply func(now time.Time, m *machine) (dup bool, err error)) (capacity.Receipt, error) {
	if err := cmd.Validate(); err != nil {
		return capacity.Receipt{}, p.wrap(err, op, cmd.NativeRef)
	}
	if err := ctx.Err(); err != nil {
		return capacity.Receipt{}, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now, err := p.enter(op)
	if err != nil {
		return capacity.Receipt{}, err
	}
	m, err := p.lookup(op, cmd.Ref)
	if err != nil {
		return capacity.Receipt{}, err
	}
	m.advance(now)
	if err := p.fence(op, m, cmd); err != nil {
		return capacity.Receipt{}, err
	}
	dup, err := apply(now, m)
	if err != nil {
		return capacity.Receipt{}, err
	}
	p.tracef("%s %s -> %s dup=%v", op, m.ref, m.state, dup)
	if p.chance(p.cfg.Faults.LostResponse) {
		p.tracef("%s %s -> lost", op, m.ref)
		return capacity.Receipt{}, ErrResponseLost
	}
	return p.receipt(m, now, dup), nil
}

// StopCapacity suspends a running machine.
func (p *Provider) StopCapacity(ctx context.Context, cmd capacity.Command) (capacity.Receipt, error) {
	if !p.support.Stop {
		return capacity.Receipt{}, refuse(capacity.CodeUnsupported, "stop", cmd.NativeRef, "this world cannot stop machines")
	}
	return p.mutate(ctx, "stop", cmd, func(now time.Time, m *machine) (bool, error) {
		switch m.state {
		case capacity.StateStopping, capacity.StateStopped:
			return true, nil
		case capacity.StateRunning:
			// A stopped spot machine is not reclaimed; its lifetime still runs.
			if m.endInterrupted {
				m.endAt, m.endInterrupted = time.Time{}, false
			}
			m.plan(now, capacity.StateStopping, transition{now.Add(p.jitter(p.cfg.Latency.Stop)), capacity.StateStopped})
			m.advance(now)
			return false, nil
		}
		return false, p.fail(capacity.CodeInvalid, "stop", m.ref, "machine is "+string(m.state))
	})
}

// StartCapacity resumes a stopped machine.
func (p *Provider) StartCapacity(ctx context.Context, cmd capacity.Command) (capacity.Receipt, error) {
	if !p.support.Resume {
		return capacity.Receipt{}, refuse(capacity.CodeUnsupported, "start", cmd.NativeRef, "this world cannot resume machines")
	}
	return p.mutate(ctx, "start", cmd, func(now time.Time, m *machine) (bool, error) {
		switch m.state {
		case capacity.StateProvisioning, capacity.StateBooting, capacity.StateRunning:
			return true, nil
		case capacity.StateStopped:
			m.plan(now, capacity.StateBooting, transition{now.Add(p.jitter(p.cfg.Latency.Start)), capacity.StateRunning})
			m.advance(now)
			return false, nil
		}
		return false, p.fail(capacity.CodeInvalid, "start", m.ref, "machine is "+string(m.state))
	})
}

// TerminateCapacity destroys a machine; terminating one already going or
// gone answers Duplicate.
func (p *Provider) TerminateCapacity(ctx context.Context, cmd capacity.Command) (capacity.Receipt, error) {
	return p.mutate(ctx, "terminate", cmd, func(now time.Time, m *machine) (bool, error) {
		switch m.state {
		case capacity.StateTerminating, capacity.StateTerminated:
			return true, nil
		}
		m.endAt, m.endInterrupted = time.Time{}, false
		m.plan(now, capacity.StateTerminating, transition{now.Add(p.jitter(p.cfg.Latency.Terminate)), capacity.StateTerminated})
		m.advance(now)
		return false, nil
	})
}

// ListOwnedCapacity lists the existing machines carrying the query's token.
func (p *Provider) ListOwnedCapacity(ctx context.Context, q capacity.OwnershipQuery) ([]capacity.OwnedCapacity, error) {
	if !p.support.ListOwned {
		return nil, refuse(capacity.CodeUnsupported, "list_owned", "", "this world cannot list machines")
	}
	if err := q.Validate(); err != nil {
		return nil, p.wrap(err, "list_owned", "")
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now, err := p.enter("list_owned")
	if err != nil {
		return nil, err
	}
	var out []capacity.OwnedCapacity
	for _, ref := range p.sortedRefs() {
		m := p.machines[ref]
		m.advance(now)
		if m.owner != q.OwnershipToken || (q.RentalID != "" && m.rental != q.RentalID) || m.state == capacity.StateTerminated {
			continue
		}
		out = append(out, m.owned(p.cfg.ConnectionID))
	}
	return out, nil
}

func (p *Provider) sortedRefs() []string {
	refs := make([]string, 0, len(p.machines))
	for ref := range p.machines {
		refs = append(refs, ref)
	}
	slices.Sort(refs)
	return refs
}

// wrap stamps a validation error with this adapter's context.
func (p *Provider) wrap(err error, op, ref string) error {
	if e, ok := err.(*capacity.Error); ok {
		e.Provider, e.Op, e.Ref = Type, op, ref
		return e
	}
	return err
}
