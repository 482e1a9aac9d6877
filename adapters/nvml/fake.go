package nvml

import (
	"context"
	"slices"
	"sync"

	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/schemas"
)

// Fake driver facts a Fake states unless told otherwise.
const (
	FakeDriverVersion    = "550.54.15"
	FakeDriverCapability = "12.4"
)

// Fake is a probe for tests: it states an NVIDIA host holding the cards it is
// fed, so placement can be tested on machines without GPUs. Safe for
// concurrent use; SetDevices changes what the next Probe states.
type Fake struct {
	mu    sync.Mutex
	facts schemas.AcceleratorFacts
}

var _ agent.AcceleratorProbe = (*Fake)(nil)

// NewFake states the given card groups with FakeDriverVersion and
// FakeDriverCapability. No devices states a host with a driver and no cards.
func NewFake(devices ...schemas.AcceleratorDevice) *Fake {
	f := &Fake{}
	f.Set(schemas.AcceleratorFacts{Established: true, Vendor: Vendor, DriverVersion: FakeDriverVersion,
		DriverCapability: FakeDriverCapability, Devices: devices})
	return f
}

// Set replaces everything the fake states, e.g. a driver capability or an
// unestablished probe.
func (f *Fake) Set(facts schemas.AcceleratorFacts) {
	facts.Devices = slices.Clone(facts.Devices)
	f.mu.Lock()
	f.facts = facts
	f.mu.Unlock()
}

// SetDevices replaces the cards, keeping the driver facts.
func (f *Fake) SetDevices(devices ...schemas.AcceleratorDevice) {
	f.mu.Lock()
	f.facts.Devices = slices.Clone(devices)
	f.mu.Unlock()
}

// Probe returns a copy of what the fake was fed.
func (f *Fake) Probe(context.Context) schemas.AcceleratorFacts {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.facts
	out.Devices = slices.Clone(out.Devices)
	return out
}
