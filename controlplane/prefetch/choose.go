package prefetch

import (
	"cmp"
	"slices"
	"strings"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// Plan is where a prefetch goes: the nodes to send it to, and the nodes the
// operator named or matched that it skips, each with why.
type Plan struct {
	Targets []string
	Skipped []schemas.PrefetchNode
	// Hot are the matching live nodes a count left out because they
	// already hold the image hot (or the artifact's replica).
	Hot []string
}

// Choose picks an image prefetch's nodes from a fleet snapshot: every live
// node the selector matches or, with count, the best count of them that
// lack the image (partial before cold, then most free disk). A node named
// by id that cannot take it (gone, lost, draining) is listed as skipped; a
// node merely matched by a key is left out silently. A named node that is
// not in the registry refuses the request. It is a pure function.
func Choose(nodes []schemas.NodeRecord, now time.Time, sel Selector, count int, digest string) (Plan, error) {
	return choose(nodes, now, sel, count, supportsPrewarm, func(n schemas.NodeRecord) schemas.LocalityState { return localityOf(n, digest) })
}

// ChooseArtifact picks an artifact prefetch's nodes as Choose does an
// image's, among nodes that declare a replica store: a node whose
// enumerated replicas list the digest holds it hot; a node that did not
// enumerate counts as lacking it. It is a pure function.
func ChooseArtifact(nodes []schemas.NodeRecord, now time.Time, sel Selector, count int, digest string) (Plan, error) {
	return choose(nodes, now, sel, count, supportsReplicas, func(n schemas.NodeRecord) schemas.LocalityState { return replicaOf(n, digest) })
}

// choose is Choose over what a node must support (supports) and how much
// of the content it holds (locality).
func choose(nodes []schemas.NodeRecord, now time.Time, sel Selector, count int,
	supports func(schemas.NodeRecord) (bool, string), locality func(schemas.NodeRecord) schemas.LocalityState) (Plan, error) {
	byID := make(map[string]schemas.NodeRecord, len(nodes))
	for _, n := range nodes {
		byID[n.NodeID] = n
	}
	for _, id := range sel.NodeIDs() {
		if _, ok := byID[id]; !ok {
			return Plan{}, &schemas.Refusal{Code: schemas.CodeUnknownNode, Field: "nodes",
				Reason: "a node the selector names is not in the registry; `warmfleet node list` shows the enrolled nodes"}
		}
	}
	named := map[string]bool{}
	for _, id := range sel.NodeIDs() {
		named[id] = true
	}
	var plan Plan
	var eligible []schemas.NodeRecord
	for _, n := range nodes {
		if !sel.Matches(n) {
			continue
		}
		why := unfit(n, now, supports)
		switch {
		case why == "":
			eligible = append(eligible, n)
		case named[n.NodeID]:
			plan.Skipped = append(plan.Skipped, schemas.PrefetchNode{NodeID: n.NodeID, State: schemas.PrefetchSkipped, Reason: why, UpdatedAt: now})
		}
	}
	if count > 0 {
		eligible = slices.DeleteFunc(eligible, func(n schemas.NodeRecord) bool {
			hot := locality(n) == schemas.LocalityHot
			if hot {
				plan.Hot = append(plan.Hot, n.NodeID)
			}
			return hot
		})
		slices.SortFunc(eligible, func(a, b schemas.NodeRecord) int {
			return cmp.Or(
				cmp.Compare(warmthRank(locality(a)), warmthRank(locality(b))),
				cmp.Compare(freeDisk(b), freeDisk(a)),
				strings.Compare(a.NodeID, b.NodeID))
		})
		eligible = eligible[:min(count, len(eligible))]
	}
	for _, n := range eligible {
		plan.Targets = append(plan.Targets, n.NodeID)
	}
	slices.Sort(plan.Targets)
	slices.Sort(plan.Hot)
	slices.SortFunc(plan.Skipped, func(a, b schemas.PrefetchNode) int { return strings.Compare(a.NodeID, b.NodeID) })
	return plan, nil
}

// unfit says why a node takes no prefetch now, or "".
func unfit(n schemas.NodeRecord, now time.Time, supports func(schemas.NodeRecord) (bool, string)) string {
	switch {
	case !n.Live(now):
		return "node is not live (its lease lapsed or it was lost); it takes no commands"
	case n.State == schemas.NodeDraining:
		return "node is draining; it takes no new work"
	}
	if ok, why := supports(n); !ok {
		return why
	}
	return ""
}

// supportsPrewarm says whether a node accepts preparation work for a
// workload it has not been asked to launch, as it declares in its facts
// (NodeSupport.Prewarm; an agent that declares nothing always did).
func supportsPrewarm(n schemas.NodeRecord) (bool, string) {
	if n.Facts == nil {
		return false, "node has reported no facts yet, so not what it supports; retry once it has"
	}
	if s := n.Facts.Supports(); !s.Prewarm {
		return false, "node declares no prewarm (its runtime " + s.ContainerRuntime + " takes no preparation work without a Run)"
	}
	return true, ""
}

// supportsReplicas says whether a node fetches artifacts into a replica
// store, as it declares in its facts (NodeSupport.ArtifactReplicas; an
// agent that declares nothing has none).
func supportsReplicas(n schemas.NodeRecord) (bool, string) {
	if n.Facts == nil {
		return false, "node has reported no facts yet, so not what it supports; retry once it has"
	}
	if !n.Facts.Supports().ArtifactReplicas {
		return false, "node declares no artifact replica store; it takes no artifact until its agent does"
	}
	return true, ""
}

// replicaOf is whether the node holds the artifact, as its facts say: hot
// when its enumerated replicas list the digest, else cold.
func replicaOf(n schemas.NodeRecord, digest string) schemas.LocalityState {
	if held, _ := n.Facts.ArtifactsOf(); held != nil {
		if _, ok := held[digest]; ok {
			return schemas.LocalityHot
		}
	}
	return schemas.LocalityCold
}

// localityOf is how ready the image is on the node, as its facts say.
func localityOf(n schemas.NodeRecord, digest string) schemas.LocalityState {
	if n.Facts != nil {
		for _, im := range n.Facts.Images {
			if im.ManifestDigest == digest {
				return im.State
			}
		}
	}
	return schemas.LocalityCold
}

// warmthRank orders nodes that lack an image: the least left to fetch first.
func warmthRank(s schemas.LocalityState) int {
	switch s {
	case schemas.LocalityPartial:
		return 0
	case schemas.LocalityCold:
		return 1
	}
	return 2
}

// freeDisk is the node's free content disk, or -1 when unknown.
func freeDisk(n schemas.NodeRecord) int64 {
	if n.Facts == nil || !n.Facts.Host.Disk.Known {
		return -1
	}
	return n.Facts.Host.Disk.FreeBytes
}
