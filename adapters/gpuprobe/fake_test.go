package gpuprobe

import (
	"context"
	"testing"

	"github.com/warmfleet/warmfleet/schemas"
)

func TestFake_FeedsDevices(t *testing.T) {
	f := NewFake(schemas.AcceleratorDevice{Model: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 << 30, Count: 8})
	got := f.Probe(context.Background())
	if !got.Established || got.Vendor != FakeVendor || got.DriverCapability != FakeDriverCapability || got.GPUCount() != 8 {
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

func TestFake_TwoCardsWithUUIDsAndCDINames(t *testing.T) {
	f := NewFakeCards(FakeCard(0, "GPU-aaaa", "NVIDIA H100 80GB HBM3", 80<<30), FakeCard(1, "GPU-bbbb", "NVIDIA H100 80GB HBM3", 80<<30))
	got := f.Probe(context.Background())
	if got.GPUCount() != 2 || len(got.Cards) != 2 || len(got.Devices) != 1 {
		t.Fatalf("Fake = %+v", got)
	}
	for i, c := range got.Cards {
		if !c.Injectable() || c.CDIDevices[0] != "nvidia.com/gpu="+[]string{"GPU-aaaa", "GPU-bbbb"}[i] || c.CDIDevices[1] != "nvidia.com/gpu="+[]string{"0", "1"}[i] {
			t.Errorf("card %d = %+v", i, c)
		}
	}
	if !got.CDI.Scanned || len(got.CDI.Devices) != 4 {
		t.Errorf("CDI = %+v", got.CDI)
	}
	got.Cards[0].CDIDevices[0] = "mutated"
	if f.Probe(context.Background()).Cards[0].CDIDevices[0] == "mutated" {
		t.Error("a caller's edit reached the fake")
	}
	// A normalised report keeps everything the fake states.
	nf := schemas.NodeFacts{Host: schemas.HostFacts{Accelerator: f.Probe(context.Background())}}
	nf.Normalize()
	if len(nf.Host.Accelerator.Cards[1].CDIDevices) != 2 {
		t.Errorf("Normalize dropped CDI names: %+v", nf.Host.Accelerator.Cards[1])
	}
}

func TestAnnotate_MIGAndUnreadableCards(t *testing.T) {
	a := probeFacts()
	a.CDI = schemas.CDIFacts{Scanned: true, Devices: []string{
		"nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=1:0", "nvidia.com/gpu=2", "nvidia.com/gpu=GPU-0",
		"nvidia.com/gpu=MIG-a", "nvidia.com/gpu=all", "example.com/gpu=GPU-1"}}
	Annotate(&a)
	if got := a.Cards[0].CDIDevices; len(got) != 2 || got[0] != "nvidia.com/gpu=GPU-0" || got[1] != "nvidia.com/gpu=0" {
		t.Errorf("card 0 names %v", got)
	}
	if got := a.Cards[1].CDIDevices; len(got) != 1 || got[0] != "nvidia.com/gpu=1" {
		t.Errorf("card 1 names %v (another vendor's kind must not count)", got)
	}
	if got := a.Cards[1].MIGDevices[0].CDIDevices; len(got) != 2 || got[0] != "nvidia.com/gpu=MIG-a" || got[1] != "nvidia.com/gpu=1:0" {
		t.Errorf("MIG names %v", got)
	}
	if got := a.Cards[2].CDIDevices; got != nil {
		t.Errorf("an unreadable card got names %v", got)
	}
}
