package placement

import (
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/warmfleet/warmfleet/schemas"
)

// TestMayWinIsNecessary: over random fleets and requests, whenever MayWin
// says no node could win, Decide names no winner. Intake relies on this to
// record "no node fits" without scoring (scheduler.AtIntake).
func TestMayWinIsNecessary(t *testing.T) {
	winners, refusals := 0, 0
	rapid.Check(t, func(t *rapid.T) {
		now := time.Unix(1_800_000_000, 0)
		res := func(label string) schemas.Resources {
			return schemas.Resources{
				CPUMillis:   rapid.Int64Range(0, 8000).Draw(t, label+"cpu"),
				MemoryBytes: rapid.Int64Range(0, 8<<30).Draw(t, label+"mem"),
				GPUCount:    rapid.Int64Range(0, 4).Draw(t, label+"gpu"),
			}
		}
		nodes := make([]*Node, rapid.IntRange(0, 6).Draw(t, "nodes"))
		for i := range nodes {
			state := rapid.SampledFrom([]schemas.NodeState{schemas.NodeReady, schemas.NodeDraining, schemas.NodeLost}).Draw(t, "state")
			lease := now.Add(time.Duration(rapid.IntRange(-5, 5).Draw(t, "lease")) * time.Second)
			gpus := []schemas.AcceleratorDevice{{Model: "NVIDIA L4", MemoryBytes: 24 << 30, Count: rapid.Int64Range(0, 4).Draw(t, "devices")}}
			facts := &schemas.NodeFacts{Host: schemas.HostFacts{OS: "linux", Architecture: "amd64",
				Accelerator: schemas.AcceleratorFacts{Established: true, Vendor: "nvidia", DriverCapability: "12.4",
					Devices: gpus, Cards: cardsOf(string(rune('a'+i)), gpus, true)},
				Disk: schemas.DiskFacts{Known: true, FreeBytes: 1 << 40}}}
			n := NewNode(schemas.NodeRecord{NodeID: string(rune('a' + i)), State: state, LeaseExpires: lease,
				Capacity: res("cap"), Facts: facts, FactsReceivedAt: now})
			for range rapid.IntRange(0, 3).Draw(t, "running") {
				n.Running = append(n.Running, Booking{RunID: "b", Resources: res("booked"), ExpectedEnd: now.Add(time.Minute)})
			}
			nodes[i] = n
		}
		fleet := NewFleet(nodes)
		need := res("need")
		req := Request{RunID: "r", Attempt: 1, Run: schemas.RunRequest{Resources: need}, Digest: "sha256:0"}
		d := Decide(req, fleet, now, DefaultConfig())
		may := fleet.MayWin(need, now)
		if !may && d.Winner != "" {
			t.Fatalf("MayWin said no node could win, Decide chose %s: %+v", d.Winner, d.Candidates)
		}
		if d.Winner != "" {
			winners++
		}
		if !may {
			refusals++
		}
	})
	if winners == 0 || refusals == 0 {
		t.Fatalf("the generator is one-sided: %d decisions with a winner, %d that MayWin refused", winners, refusals)
	}
}
