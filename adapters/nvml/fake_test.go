package nvml

import (
	"context"
	"testing"

	"github.com/warmfleet/warmfleet/schemas"
)

func TestFake_FeedsDevices(t *testing.T) {
	f := NewFake(schemas.AcceleratorDevice{Model: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 << 30, Count: 8})
	got := f.Probe(context.Background())
	if !got.Established || got.Vendor != Vendor || got.DriverCapability != FakeDriverCapability || got.GPUCount() != 8 {
		t.Fatalf("Fake = %+v", got)
	}
	got.Devices[0].Count = 1 // callers own what they get
	f.SetDevices(schemas.AcceleratorDevice{Model: "NVIDIA L4", MemoryBytes: 24 << 30, Count: 1})
	if n := f.Probe(context.Background()).GPUCount(); n != 1 {
		t.Fatalf("after SetDevices: %d GPUs, want 1", n)
	}
	f.Set(schemas.AcceleratorFacts{})
	if f.Probe(context.Background()).Established {
		t.Fatal("Set(zero) still established")
	}
}
