package placement

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// benchFleet builds n nodes with realistic facts: each holds 50 of 400
// images, drawn from a universe of 200 layers (images share base layers).
func benchFleet(n int) (*Fleet, Request) {
	rng := rand.New(rand.NewPCG(1, 2))
	const universe, imagesPerNode, catalogue = 200, 50, 400
	layers := make([]string, universe)
	for i := range layers {
		layers[i] = fmt.Sprintf("sha256:%064x", i)
	}
	type img struct {
		digest string
		layers []string
		sizes  []int64
	}
	cat := make([]img, catalogue)
	for i := range cat {
		im := img{digest: fmt.Sprintf("sha256:%064x", 1_000_000+i)}
		for j := range 4 + rng.IntN(6) {
			// low layer indexes are shared bases
			l := rng.IntN(universe / (1 + j%3))
			im.layers = append(im.layers, layers[l])
			im.sizes = append(im.sizes, int64(50_000_000+rng.IntN(1_000_000_000)))
		}
		cat[i] = im
	}
	now := time.Now()
	nodes := make([]*Node, n)
	for i := range nodes {
		facts := &schemas.NodeFacts{Host: schemas.HostFacts{OS: "linux", Architecture: "amd64",
			Accelerator: schemas.AcceleratorFacts{Established: true, Vendor: "nvidia", DriverCapability: "12.4",
				Devices: []schemas.AcceleratorDevice{{Model: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 << 30, Count: 8}}, Cards: h100s(i)},
			Disk: schemas.DiskFacts{Known: true, FreeBytes: 1 << 40}}}
		for _, k := range rng.Perm(catalogue)[:imagesPerNode] {
			im := cat[k]
			facts.Images = append(facts.Images, schemas.ImageLocality{ManifestDigest: im.digest, State: schemas.LocalityHot, ContentPresent: true,
				LayerDigests: im.layers, LayerSizes: im.sizes, Platform: schemas.Platform{OS: "linux", Architecture: "amd64"}})
		}
		facts.Caches = []schemas.CacheFact{{Name: "weights", CompatibilityKey: fmt.Sprint(i % 7), SizeBytes: 10 << 30}}
		rec := schemas.NodeRecord{NodeID: fmt.Sprintf("node-%05d", i), State: schemas.NodeReady, FencingToken: 1,
			Capacity:     schemas.Resources{CPUMillis: 64000, MemoryBytes: 512 << 30, GPUCount: 8},
			LeaseExpires: now.Add(time.Minute), Facts: facts, FactsReceivedAt: now, PricePerHour: 1 + float64(i%5)}
		node := NewNode(rec)
		if i%3 == 0 {
			node.Running = []Booking{{RunID: "busy", Resources: schemas.Resources{CPUMillis: 60000, GPUCount: 8}, ExpectedEnd: now.Add(time.Duration(i%600) * time.Second)}}
		}
		nodes[i] = node
	}
	req := Request{RunID: "r-bench", Attempt: 1, Digest: cat[7].digest, Run: schemas.RunRequest{RequestID: "bench",
		Image: "registry.example/app@" + cat[7].digest, Resources: schemas.Resources{CPUMillis: 8000, MemoryBytes: 64 << 30, GPUCount: 2},
		GPU: &schemas.GPURequirement{Model: "H100"}, Caches: []schemas.CacheMount{{Name: "weights", CompatibilityKey: "3", Path: "/w"}}}}
	return NewFleet(nodes), req
}

// BenchmarkPlacement is one full decision (every node scored and explained).
// BenchmarkPlacementBaselineFit, over the same fleet, only checks free
// resources per node — the floor any decision pays — so the ratio of the
// two is the price of warmth-aware scoring and its audit trail.
func BenchmarkPlacement(b *testing.B) {
	for _, n := range []int{100, 1_000, 10_000} {
		fleet, req := benchFleet(n)
		now := time.Now()
		cfg := DefaultConfig()
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				d := Decide(req, fleet, now, cfg)
				if d.Winner == "" {
					b.Fatal("no winner")
				}
			}
		})
	}
}

func BenchmarkPlacementBaselineFit(b *testing.B) {
	for _, n := range []int{100, 1_000, 10_000} {
		fleet, req := benchFleet(n)
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				fits := 0
				for _, node := range fleet.Nodes {
					free := node.Record.Capacity
					for _, r := range node.Running {
						free = free.Sub(r.Resources)
					}
					if req.Run.Resources.Fits(free) {
						fits++
					}
				}
				if fits == 0 {
					b.Fatal("nothing fits")
				}
			}
		})
	}
}

// BenchmarkPlacementCandidateList is the floor of a decision that explains
// every node: it allocates the Candidate list and writes each node's id and
// capacity into it. At 10k nodes that is 2 MB of fresh memory a decision,
// whose first touch the kernel pays for.
func BenchmarkPlacementCandidateList(b *testing.B) {
	for _, n := range []int{100, 1_000, 10_000} {
		fleet, _ := benchFleet(n)
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				cs := make([]schemas.Candidate, len(fleet.Nodes))
				for i, node := range fleet.Nodes {
					cs[i].NodeID, cs[i].Free = node.Record.NodeID, node.Record.Capacity
				}
				if cs[len(cs)-1].NodeID == "" {
					b.Fatal("no candidates")
				}
			}
		})
	}
}

// h100s are node i's eight cards by identity, each with a CDI device.
func h100s(i int) []schemas.GPUCard {
	cards := make([]schemas.GPUCard, 8)
	for j := range cards {
		cards[j] = schemas.GPUCard{Index: j, UUID: fmt.Sprintf("GPU-%05d-%d", i, j), Model: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 << 30,
			Health: schemas.GPUHealthOK, CDIDevices: []string{fmt.Sprintf("nvidia.com/gpu=%d", j)}}
	}
	return cards
}
