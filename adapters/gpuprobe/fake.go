package gpuprobe

import (
	"context"
	"slices"
	"strconv"
	"sync"

	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/schemas"
)

// Fake driver facts a Fake states unless told otherwise.
const (
	FakeVendor           = "nvidia"
	FakeDriverVersion    = "550.54.15"
	FakeDriverCapability = "12.4"
)

// Fake is a probe for tests: it states an NVIDIA host holding the cards it
// is fed, so placement and device booking can be tested on machines without
// GPUs. Safe for concurrent use; Set changes what the next Probe states.
type Fake struct {
	mu    sync.Mutex
	facts schemas.AcceleratorFacts
}

var _ agent.AcceleratorProbe = (*Fake)(nil)

// NewFake states the given card groups (no per-card identities) with
// FakeDriverVersion and FakeDriverCapability. No devices states a host with
// a driver and no cards.
func NewFake(devices ...schemas.AcceleratorDevice) *Fake {
	f := &Fake{}
	f.Set(schemas.AcceleratorFacts{Established: true, Vendor: FakeVendor, DriverVersion: FakeDriverVersion,
		DriverCapability: FakeDriverCapability, Devices: devices})
	return f
}

// NewFakeCards states the given cards, their groups, and a scanned CDI
// spec offering every CDI name the cards carry. FakeCard builds one.
func NewFakeCards(cards ...schemas.GPUCard) *Fake {
	facts := schemas.AcceleratorFacts{Established: true, Vendor: FakeVendor, DriverVersion: FakeDriverVersion,
		DriverCapability: FakeDriverCapability, Devices: schemas.GroupCards(cards), Cards: cards,
		CDI: schemas.CDIFacts{Scanned: true, SpecDirs: []string{"/var/run/cdi"}}}
	for _, c := range cards {
		facts.CDI.Devices = append(facts.CDI.Devices, c.CDIDevices...)
	}
	slices.Sort(facts.CDI.Devices)
	f := &Fake{}
	f.Set(facts)
	return f
}

// FakeCard is a healthy whole card offered through CDI as
// "nvidia.com/gpu=<uuid>" and "nvidia.com/gpu=<index>".
func FakeCard(index int, uuid, model string, memoryBytes int64) schemas.GPUCard {
	return schemas.GPUCard{Index: index, UUID: uuid, Model: model, MemoryBytes: memoryBytes,
		MIGMode: schemas.MIGDisabled, Health: schemas.GPUHealthOK,
		CDIDevices: []string{NVIDIAKind + "=" + uuid, NVIDIAKind + "=" + strconv.Itoa(index)}}
}

// Set replaces everything the fake states, e.g. a driver capability or an
// unestablished probe.
func (f *Fake) Set(facts schemas.AcceleratorFacts) {
	facts = clone(facts)
	f.mu.Lock()
	f.facts = facts
	f.mu.Unlock()
}

// SetDevices replaces the card groups, keeping the rest.
func (f *Fake) SetDevices(devices ...schemas.AcceleratorDevice) {
	f.mu.Lock()
	f.facts.Devices = slices.Clone(devices)
	f.mu.Unlock()
}

// Probe returns a copy of what the fake was fed.
func (f *Fake) Probe(context.Context) schemas.AcceleratorFacts {
	f.mu.Lock()
	defer f.mu.Unlock()
	return clone(f.facts)
}

// clone copies every slice of a, so callers own what they get.
func clone(a schemas.AcceleratorFacts) schemas.AcceleratorFacts {
	a.Devices = slices.Clone(a.Devices)
	a.Cards = slices.Clone(a.Cards)
	for i := range a.Cards {
		c := &a.Cards[i]
		c.CDIDevices = slices.Clone(c.CDIDevices)
		c.MIGDevices = slices.Clone(c.MIGDevices)
		for j := range c.MIGDevices {
			c.MIGDevices[j].CDIDevices = slices.Clone(c.MIGDevices[j].CDIDevices)
		}
	}
	a.CDI.SpecDirs = slices.Clone(a.CDI.SpecDirs)
	a.CDI.Devices = slices.Clone(a.CDI.Devices)
	a.CDI.Errors = slices.Clone(a.CDI.Errors)
	return a
}
