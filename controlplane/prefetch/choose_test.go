package prefetch

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// node is a live, ready node record with facts.
func node(id, arch, gpu string, free int64, images ...schemas.ImageLocality) schemas.NodeRecord {
	n := schemas.NodeRecord{NodeID: id, State: schemas.NodeReady, FencingToken: 1, LeaseExpires: t0.Add(time.Minute),
		Facts: &schemas.NodeFacts{Host: schemas.HostFacts{OS: "linux", Architecture: arch, Disk: schemas.DiskFacts{Known: free >= 0, FreeBytes: max(free, 0)}}, Images: images}}
	if gpu != "" {
		n.Facts.Host.Accelerator = schemas.AcceleratorFacts{Established: true, Vendor: "nvidia", Devices: []schemas.AcceleratorDevice{{Model: gpu, Count: 1}}}
	}
	return n
}

var t0 = time.Date(2026, 12, 5, 6, 0, 0, 0, time.UTC)

const digest = "sha256:1111111111111111111111111111111111111111111111111111111111111111"

func image(state schemas.LocalityState) schemas.ImageLocality {
	return schemas.ImageLocality{ManifestDigest: digest, State: state}
}

func TestChoose(t *testing.T) {
	lost := node("lost", "amd64", "", 10)
	lost.LeaseExpires = t0.Add(-time.Second)
	draining := node("drain", "amd64", "", 10)
	draining.State = schemas.NodeDraining
	fleet := []schemas.NodeRecord{
		node("hot", "amd64", "", 900, image(schemas.LocalityHot)),
		node("partial", "amd64", "", 5, image(schemas.LocalityPartial)),
		node("roomy", "amd64", "", 800),
		node("tight", "amd64", "", 100),
		node("unknown-disk", "amd64", "", -1),
		node("arm", "arm64", "", 999),
		lost, draining,
	}
	choose := func(sel string, count int) Plan {
		t.Helper()
		s, err := ParseSelector(sel)
		if err != nil {
			t.Fatal(err)
		}
		p, err := Choose(fleet, t0, s, count, digest)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	eq := func(what string, got []string, want ...string) {
		t.Helper()
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("%s: %v, want %v", what, got, want)
		}
	}
	// Everything live, hot nodes too (the node answers ready at once).
	p := choose("", 0)
	eq("all", p.Targets, "arm", "hot", "partial", "roomy", "tight", "unknown-disk")
	if len(p.Skipped) != 0 {
		t.Errorf("all: unnamed unfit nodes listed as skipped: %+v", p.Skipped)
	}
	// The best that lack it: partial first, then the most free disk; unknown disk last.
	eq("count 3", choose("arch=amd64", 3).Targets, "partial", "roomy", "tight")
	eq("count 4", choose("arch=amd64", 4).Targets, "partial", "roomy", "tight", "unknown-disk")
	eq("count beyond", choose("arch=amd64", 50).Targets, "partial", "roomy", "tight", "unknown-disk")
	p = choose("hot", 1)
	eq("count of hot only", p.Targets)
	eq("left out hot", p.Hot, "hot")
	// Named nodes that cannot take it are skipped with why.
	p = choose("lost,drain,roomy", 0)
	eq("named", p.Targets, "roomy")
	if len(p.Skipped) != 2 || p.Skipped[0].NodeID != "drain" || !strings.Contains(p.Skipped[0].Reason, "draining") ||
		p.Skipped[1].NodeID != "lost" || !strings.Contains(p.Skipped[1].Reason, "not live") || p.Skipped[1].State != schemas.PrefetchSkipped {
		t.Errorf("skipped %+v", p.Skipped)
	}
	// A node that declares no prewarm takes no prefetch, and says so.
	serial := node("no-prewarm", "amd64", "", 900)
	serial.Facts.Support = &schemas.NodeSupport{ContainerRuntime: "example", ExactImageInventory: true}
	fleet = append(fleet, serial)
	p = choose("no-prewarm,roomy", 0)
	eq("named without prewarm", p.Targets, "roomy")
	if len(p.Skipped) != 1 || p.Skipped[0].NodeID != "no-prewarm" || !strings.Contains(p.Skipped[0].Reason, "declares no prewarm") {
		t.Errorf("skipped %+v", p.Skipped)
	}
	eq("all, without the node declaring no prewarm", choose("", 0).Targets, "arm", "hot", "partial", "roomy", "tight", "unknown-disk")
	// A named node not in the registry refuses the request.
	s, _ := ParseSelector("roomy,ghost")
	if _, err := Choose(fleet, t0, s, 0, digest); !errors.Is(err, &schemas.Refusal{Code: schemas.CodeUnknownNode, Field: "nodes"}) {
		t.Errorf("unknown node: %v", err)
	}
}

func TestOpID(t *testing.T) {
	id := schemas.PrefetchIDFor("req")
	if got := OpID(id, "node-a"); got != id+".node-a.prefetch" || schemas.ValidateID("op", got, schemas.CodeMalformed) != nil {
		t.Errorf("OpID %q", got)
	}
	long := strings.Repeat("n", 128)
	a, b := OpID(id, long), OpID(id, long[:127]+"m")
	if a == b || schemas.ValidateID("op", a, schemas.CodeMalformed) != nil || len(a) > 128 {
		t.Errorf("long node ids: %q %q", a, b)
	}
}

// replicaNode is a live node with a replica store holding the given
// digests (enumerated), or one that did not enumerate (held nil).
func replicaNode(id string, free int64, held ...string) schemas.NodeRecord {
	n := node(id, "amd64", "", free)
	n.Facts.Support = &schemas.NodeSupport{ContainerRuntime: "containerd", Prewarm: true, ArtifactReplicas: true}
	if held != nil {
		n.Facts.Artifacts = &schemas.ArtifactInventory{Enumerated: true}
		for _, d := range held {
			n.Facts.Artifacts.Replicas = append(n.Facts.Artifacts.Replicas, schemas.ArtifactReplica{Digest: d, SizeBytes: 1})
		}
	}
	return n
}

// TestChooseArtifact: an artifact goes to live nodes that declare a replica
// store; with a count, the nodes whose enumerated replicas list the digest
// are left out as hot and the rest are taken by most free disk. Nodes
// without a store, lost or draining are skipped with why when named.
func TestChooseArtifact(t *testing.T) {
	const other = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
	lost := replicaNode("lost", 10, other)
	lost.LeaseExpires = t0.Add(-time.Second)
	draining := replicaNode("drain", 10, other)
	draining.State = schemas.NodeDraining
	noStore := node("no-store", "amd64", "", 999) // declares nothing: legacy support has no replica store
	noFacts := replicaNode("no-facts", 1)
	noFacts.Facts = nil
	fleet := []schemas.NodeRecord{
		replicaNode("hot", 900, other, digest),
		replicaNode("roomy", 800, other),
		replicaNode("tight", 100),
		replicaNode("not-enumerated", 500, nil...), // says nothing of what it holds: cold
		replicaNode("unknown-disk", -1),
		noStore, noFacts, lost, draining,
	}
	for _, c := range []struct {
		name, sel      string
		count          int
		targets, hot   []string
		skipped, whyIs []string
	}{
		{name: "every live node with a store, hot ones too", targets: []string{"hot", "not-enumerated", "roomy", "tight", "unknown-disk"}},
		{name: "count takes the most free disk among those lacking it", count: 2, targets: []string{"not-enumerated", "roomy"}, hot: []string{"hot"}},
		{name: "count beyond", count: 50, targets: []string{"not-enumerated", "roomy", "tight", "unknown-disk"}, hot: []string{"hot"}},
		{name: "count of hot only", sel: "hot", count: 1, hot: []string{"hot"}},
		{name: "named unfit nodes skipped with why", sel: "no-store,no-facts,lost,drain,tight", targets: []string{"tight"},
			skipped: []string{"drain", "lost", "no-facts", "no-store"}, whyIs: []string{"draining", "not live", "no facts", "no artifact replica store"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := ParseSelector(c.sel)
			if err != nil {
				t.Fatal(err)
			}
			p, err := ChooseArtifact(fleet, t0, s, c.count, digest)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(p.Targets, ",") != strings.Join(c.targets, ",") || strings.Join(p.Hot, ",") != strings.Join(c.hot, ",") {
				t.Errorf("targets %v hot %v, want %v and %v", p.Targets, p.Hot, c.targets, c.hot)
			}
			if len(p.Skipped) != len(c.skipped) {
				t.Fatalf("skipped %+v, want %v", p.Skipped, c.skipped)
			}
			for i, sk := range p.Skipped {
				if sk.NodeID != c.skipped[i] || sk.State != schemas.PrefetchSkipped || !strings.Contains(sk.Reason, c.whyIs[i]) {
					t.Errorf("skipped %d: %+v, want %s (%s)", i, sk, c.skipped[i], c.whyIs[i])
				}
			}
		})
	}
	s, _ := ParseSelector("ghost")
	if _, err := ChooseArtifact(fleet, t0, s, 0, digest); !errors.Is(err, &schemas.Refusal{Code: schemas.CodeUnknownNode, Field: "nodes"}) {
		t.Errorf("unknown node: %v", err)
	}
}
