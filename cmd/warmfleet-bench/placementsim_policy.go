package main

import (
	"math"

	"github.com/warmfleet/warmfleet/controlplane/placement"
	"github.com/warmfleet/warmfleet/schemas"
)

// simPolicy chooses where a Run goes.
type simPolicy interface {
	name() string
	// queues reports whether the policy may book a Run behind a busy node.
	queues() bool
	choose(s *simulator, fleet *placement.Fleet, run int, req placement.Request, now float64) simChoice
}

// simChoice is a policy's answer: the node's position and whether the Run
// waits in that node's queue; ok is false when the Run stays in the
// scheduler's queue (no node was eligible, or none that the policy would
// book), which skips the rest of its shape in the pass.
type simChoice struct {
	node       int
	queued, ok bool
	// fetchFirst: the Run fetches its bytes on the node before it claims
	// cards there (placement's FetchFirst).
	fetchFirst bool
	// expectReady is when the policy expects the Run's bytes there, in
	// trace seconds (the booking's time when it does not say).
	expectReady float64
}

// simPolicies are the policies placement-sim compares, by name.
func simPolicies(cfg placement.Config) []simPolicy {
	return []simPolicy{warmfleetPolicy{cfg: cfg}, randomPolicy{}, leastAllocatedPolicy{}, binPackPolicy{}, imageLocalityPolicy{}}
}

// warmfleetPolicy is placement.Decide, as the scheduler calls it.
type warmfleetPolicy struct{ cfg placement.Config }

func (warmfleetPolicy) name() string { return "warmfleet" }
func (warmfleetPolicy) queues() bool { return true }

func (p warmfleetPolicy) choose(s *simulator, fleet *placement.Fleet, run int, req placement.Request, now float64) simChoice {
	d := placement.Decide(req, fleet, s.clock(now), p.cfg)
	if d.Winner == "" {
		return simChoice{}
	}
	c := simChoice{node: s.nodeIndex(d.Winner), queued: d.WinnerQueued, fetchFirst: d.FetchFirst, ok: true, expectReady: now}
	if at := placement.ReadyAt(d, s.clock(now)); !at.IsZero() {
		c.expectReady = at.Sub(simEpoch()).Seconds()
	}
	return c
}

func (s *simulator) nodeIndex(id string) int { return s.nodePos[id] }

// fitsNow lists the nodes a baseline may book req on now: those placement
// finds eligible (the same hard constraints: GPUs, memory, disk for
// artifacts) whose cards are free now with nobody queued. Baselines never
// queue behind a busy node.
func (s *simulator) fitsNow(fleet *placement.Fleet, req placement.Request, now float64) []int {
	d := placement.Decide(req, fleet, s.clock(now), s.cfg)
	var fits []int
	for _, c := range d.Candidates {
		// A node placement declines to queue on (at capacity) passed
		// the hard constraints: that is warmfleet's choice, not a fit.
		if !c.Eligible && c.Reason != schemas.ReasonAtCapacity {
			continue
		}
		i := s.nodeIndex(c.NodeID)
		if n := s.nodes[i]; len(n.queued) == 0 && n.freeCards() >= int(req.Run.Resources.GPUCount) {
			fits = append(fits, i)
		}
	}
	return fits
}

// best returns the fitting node with the highest score, ties broken at
// random as kube-scheduler's selectHost does.
func (s *simulator) best(fits []int, score func(int) float64) (int, bool) {
	if len(fits) == 0 {
		return 0, false
	}
	best, top, ties := -1, math.Inf(-1), 0
	for _, i := range fits {
		switch v := score(i); {
		case v > top:
			best, top, ties = i, v, 1
		case v == top:
			ties++
			if s.rng.IntN(ties) == 0 {
				best = i
			}
		}
	}
	return best, true
}

// randomPolicy books a node that fits, uniformly at random.
type randomPolicy struct{}

func (randomPolicy) name() string { return "random" }
func (randomPolicy) queues() bool { return false }

func (randomPolicy) choose(s *simulator, fleet *placement.Fleet, run int, req placement.Request, now float64) simChoice {
	fits := s.fitsNow(fleet, req, now)
	if len(fits) == 0 {
		return simChoice{}
	}
	return simChoice{node: fits[s.rng.IntN(len(fits))], ok: true}
}

// leastAllocatedScore is Kubernetes' NodeResourcesFit with its default
// LeastAllocated strategy over cpu and memory, weight 1 each: per resource
// (allocatable − requested) × 100 / allocatable, requested counting the new
// Pod, averaged (kubernetes pkg/scheduler/framework/plugins/noderesources/
// least_allocated.go). Integer arithmetic, as there.
func (s *simulator) leastAllocatedScore(node int, gpus int) int64 {
	n := s.nodes[node]
	total := int64(len(n.cards))
	used := total - int64(n.freeCards()) + int64(gpus)
	cpuCap, memCap := simCPUPerGPU*total, int64(simMemPerGPU)*total
	cpu := (cpuCap - simCPUPerGPU*used) * 100 / cpuCap
	mem := (memCap - simMemPerGPU*used) * 100 / memCap
	return (cpu + mem) / 2
}

// leastAllocatedPolicy is Kubernetes' default spread: the node with the most
// free resources.
type leastAllocatedPolicy struct{}

func (leastAllocatedPolicy) name() string { return "least-allocated" }
func (leastAllocatedPolicy) queues() bool { return false }

func (leastAllocatedPolicy) choose(s *simulator, fleet *placement.Fleet, run int, req placement.Request, now float64) simChoice {
	g := int(req.Run.Resources.GPUCount)
	i, ok := s.best(s.fitsNow(fleet, req, now), func(i int) float64 { return float64(s.leastAllocatedScore(i, g)) })
	return simChoice{node: i, ok: ok}
}

// binPackPolicy is Nomad's default "binpack" algorithm: ScoreFitBinPack
// (nomad/structs/funcs.go), 20 − (10^freeCPU + 10^freeMemory) with the
// free fractions after the new allocation, clamped to 0..18; the fullest
// node wins. Nomad scores a limited sample of nodes; this scores them all.
type binPackPolicy struct{}

func (binPackPolicy) name() string { return "bin-pack" }
func (binPackPolicy) queues() bool { return false }

func (binPackPolicy) choose(s *simulator, fleet *placement.Fleet, run int, req placement.Request, now float64) simChoice {
	g := int(req.Run.Resources.GPUCount)
	i, ok := s.best(s.fitsNow(fleet, req, now), func(i int) float64 {
		n := s.nodes[i]
		free := float64(n.freeCards()-g) / float64(len(n.cards)) // cpu and memory free fractions are equal here
		return min(18, max(0, 20-(math.Pow(10, free)+math.Pow(10, free))))
	})
	return simChoice{node: i, ok: ok}
}

// Kubernetes ImageLocality's bounds: kubernetes pkg/scheduler/framework/
// plugins/imagelocality/image_locality.go, minThreshold and
// maxContainerThreshold.
const (
	k8sMB                    = 1024 * 1024
	k8sMinThreshold          = 23 * k8sMB
	k8sMaxContainerThreshold = 1000 * k8sMB
	k8sMaxNodeScore          = 100
)

// imageLocalityScore is Kubernetes' ImageLocality score for a Pod of
// containers images on a node, reimplemented from kubernetes
// pkg/scheduler/framework/plugins/imagelocality/image_locality.go: each
// image the node holds scores its size × (nodes holding it / all nodes)
// (scaledImageScore), summed (sumImageScores), clamped to minThreshold ..
// maxContainerThreshold × containers and scaled to 0..MaxNodeScore
// (calculatePriority).
func imageLocalityScore(sizes []int64, holders []int, totalNodes int, held []bool) int64 {
	var sum int64
	for i, size := range sizes {
		if held[i] {
			sum += int64(float64(size) * (float64(holders[i]) / float64(totalNodes)))
		}
	}
	maxThreshold := int64(k8sMaxContainerThreshold * len(sizes))
	sum = min(max(sum, k8sMinThreshold), maxThreshold)
	return k8sMaxNodeScore * (sum - k8sMinThreshold) / (maxThreshold - k8sMinThreshold)
}

// imageLocalityPolicy is ImageLocality as a Kubernetes user runs it: in
// the default scheduler profile, whose scores that vary here are
// ImageLocality and NodeResourcesFit (least-allocated), weight 1 each
// (BalancedAllocation is constant: Runs ask for CPU and memory in
// proportion). Scored alone it would pile every Run onto the image's
// holders regardless of load, which no default cluster does.
type imageLocalityPolicy struct{}

func (imageLocalityPolicy) name() string { return "image-locality" }
func (imageLocalityPolicy) queues() bool { return false }

func (imageLocalityPolicy) choose(s *simulator, fleet *placement.Fleet, run int, req placement.Request, now float64) simChoice {
	image := s.runs[run].image
	var size int64
	for _, l := range s.cat.images[image].layers {
		size += s.cat.layerBytes[l]
	}
	holders := 0
	for _, n := range s.nodes {
		if s.hot(n, image, now) {
			holders++
		}
	}
	g := int(req.Run.Resources.GPUCount)
	i, ok := s.best(s.fitsNow(fleet, req, now), func(i int) float64 {
		il := imageLocalityScore([]int64{size}, []int{holders}, len(s.nodes), []bool{s.hot(s.nodes[i], image, now)})
		return float64(il + s.leastAllocatedScore(i, g))
	})
	return simChoice{node: i, ok: ok}
}
