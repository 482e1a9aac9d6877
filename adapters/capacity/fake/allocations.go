package fake

import (
	"fmt"
	"slices"
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity"
)

// Allocation is one machine the world created: the ledger tests read to
// assert that no operation was ever allocated twice.
type Allocation struct {
	NativeRef     string
	RentalID      string
	OperationKey  string
	Generation    uint64
	OfferID       string
	Interruptible bool
	At            time.Time
}

// Allocations returns every allocation so far, in order.
func (p *Provider) Allocations() []Allocation {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.allocations)
}

// AllocationCount is how many machines were allocated for rentalID.
func (p *Provider) AllocationCount(rentalID string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, a := range p.allocations {
		if a.RentalID == rentalID {
			n++
		}
	}
	return n
}

// DoubleAllocations returns the operation keys that allocated more than one
// machine. It is empty in a correct world.
func (p *Provider) DoubleAllocations() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	seen := map[string]int{}
	var out []string
	for _, a := range p.allocations {
		seen[a.OperationKey]++
		if seen[a.OperationKey] == 2 {
			out = append(out, a.OperationKey)
		}
	}
	return out
}

// Received returns what the machine received as user data: the bootstrap
// delivered to it, byte for byte.
func (p *Provider) Received(nativeRef string) ([]byte, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.machines[nativeRef]
	if m == nil {
		return nil, false
	}
	return slices.Clone(m.userData), true
}

// PlantForeign creates a running machine that belongs to someone else (it
// carries ownershipToken, and rentalID may copy one of ours) and that is
// not in our allocation ledger. Ownership tests use it to check that a
// machine which merely resembles ours is never listed or touched.
func (p *Provider) PlantForeign(rentalID, ownershipToken string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.clock.Now()
	p.seq++
	m := &machine{ref: fmt.Sprintf("fk-%06d", p.seq), rental: rentalID, owner: ownershipToken,
		opKey: "foreign-" + rentalID, generation: 1, createdAt: now}
	if len(p.cfg.Offers) > 0 {
		m.offer = p.cfg.Offers[0]
	}
	m.plan(now, capacity.StateRunning)
	p.machines[m.ref] = m
	return m.ref
}

// Advance moves the world's clock forward when it is an Advancer, and
// reports whether it could.
func (p *Provider) Advance(d time.Duration) bool {
	a, ok := p.clock.(Advancer)
	if ok {
		a.Advance(d)
	}
	return ok
}

// Now is the world's time.
func (p *Provider) Now() time.Time { return p.clock.Now() }

// Trace is the world's log of every call's outcome, in order; two worlds
// with one seed given one sequence of calls have equal traces.
func (p *Provider) Trace() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.trace)
}

func (p *Provider) tracef(format string, args ...any) {
	p.trace = append(p.trace, p.clock.Now().Format(time.RFC3339Nano)+" "+fmt.Sprintf(format, args...))
}

// Interrupt reclaims an interruptible machine now, as the spot market
// does: it is terminated and observed interrupted. It reports whether the
// machine was one to interrupt.
func (p *Provider) Interrupt(nativeRef string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.machines[nativeRef]
	if m == nil || !m.interruptible {
		return false
	}
	now := p.clock.Now()
	m.advance(now)
	if m.state == capacity.StateTerminated {
		return false
	}
	m.endAt, m.endInterrupted = now, true
	m.advance(now)
	p.tracef("interrupt %s", nativeRef)
	return true
}
