package placement

import (
	"fmt"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// gpuNode is a ready node with eight cards of one model and memory, the
// first unhealthy of them sick. It takes no preparation ahead, so a Run
// placed there is booked its cards at once.
func gpuNode(id, model string, memory int64, unhealthy int, now time.Time) *Node {
	acc := schemas.AcceleratorFacts{Established: true, Vendor: "nvidia", DriverCapability: "12.4",
		Devices: []schemas.AcceleratorDevice{{Model: model, MemoryBytes: memory, Count: 8}}}
	for j := range 8 {
		c := schemas.GPUCard{Index: j, UUID: fmt.Sprintf("GPU-%s-%d", id, j), Model: model, MemoryBytes: memory,
			Health: schemas.GPUHealthOK, CDIDevices: []string{fmt.Sprintf("nvidia.com/gpu=%d", j)}}
		if j < unhealthy {
			c.Health = "unhealthy"
		}
		acc.Cards = append(acc.Cards, c)
	}
	return NewNode(schemas.NodeRecord{NodeID: id, State: schemas.NodeReady, LeaseExpires: now.Add(time.Minute),
		Capacity: schemas.Resources{CPUMillis: 64000, MemoryBytes: 512 << 30, GPUCount: 8}, FactsReceivedAt: now,
		Facts: &schemas.NodeFacts{Host: schemas.HostFacts{OS: "linux", Architecture: "amd64", Accelerator: acc},
			Support: &schemas.NodeSupport{ContainerRuntime: "containerd", ExactImageInventory: true}}})
}

// TestGPUKindsAcrossNodes: a decision matches each kind of card once and
// reuses the answer, so nodes of alternating kinds must each still get
// their own: the model, the memory floor, sick cards and cards a running
// booking holds.
func TestGPUKindsAcrossNodes(t *testing.T) {
	now := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	fleet := func() *Fleet {
		held := gpuNode("d-held", "NVIDIA H100 80GB HBM3", 80<<30, 0, now)
		// It books no GPU count, so only the cards it holds keep the Run out.
		held.Running = []Booking{{RunID: "r-held", ExpectedEnd: now.Add(time.Hour),
			GPUs: []string{"GPU-d-held-0", "GPU-d-held-1", "GPU-d-held-2", "GPU-d-held-3", "GPU-d-held-4", "GPU-d-held-5"}}}
		return NewFleet([]*Node{
			gpuNode("a-h100", "NVIDIA H100 80GB HBM3", 80<<30, 0, now),
			gpuNode("b-a100", "NVIDIA A100-SXM4-40GB", 40<<30, 0, now),
			gpuNode("c-sick", "NVIDIA H100 80GB HBM3", 80<<30, 6, now),
			held,
			gpuNode("e-small", "NVIDIA H100 PCIe", 40<<30, 0, now),
			gpuNode("f-h100", "NVIDIA H100 80GB HBM3", 80<<30, 0, now),
		})
	}
	req := Request{RunID: "r", Attempt: 1, Run: schemas.RunRequest{Resources: schemas.Resources{CPUMillis: 1000, GPUCount: 4},
		GPU: &schemas.GPURequirement{Model: "H100", MinMemoryBytes: 60 << 30}}}
	cfg := DefaultConfig()
	cfg.WholeNodeSeconds = 0

	d := Decide(req, fleet(), now, cfg)
	want := map[string]schemas.Code{"a-h100": "", "b-a100": schemas.ReasonGPUModelMismatch, "c-sick": schemas.ReasonGPUNotInjectable,
		"d-held": schemas.ReasonOutscored, "e-small": schemas.ReasonGPUModelMismatch, "f-h100": schemas.ReasonOutscored}
	for id, code := range want {
		if c := candidate(t, d.Candidates, id); c.Reason != code {
			t.Errorf("%s: reason %q (%s), want %q", id, c.Reason, c.Detail, code)
		}
	}
	if d.Winner != "a-h100" || d.WinnerQueued || len(d.GPUs) != 4 {
		t.Errorf("winner %q (queued %v) with %v, want a-h100 with 4 cards", d.Winner, d.WinnerQueued, d.GPUs)
	}

	// Alone, the node whose cards are held takes the Run only into its
	// queue: two of its cards are free and the Run needs four.
	held := NewFleet([]*Node{fleet().Node("d-held")})
	if d := Decide(req, held, now, cfg); d.Winner != "d-held" || !d.WinnerQueued || len(d.GPUs) != 0 {
		t.Errorf("held cards: winner %q queued %v with %v, want d-held queued without cards", d.Winner, d.WinnerQueued, d.GPUs)
	}

	// Any card: the A100 node and the small H100 qualify.
	req.Run.GPU = nil
	d = Decide(req, fleet(), now, cfg)
	for _, id := range []string{"b-a100", "e-small"} {
		if c := candidate(t, d.Candidates, id); !c.Eligible {
			t.Errorf("any card: %s not eligible: %s %s", id, c.Reason, c.Detail)
		}
	}
}
