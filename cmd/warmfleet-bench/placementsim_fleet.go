package main

import (
	"fmt"
	"slices"
	"time"

	"github.com/warmfleet/warmfleet/controlplane/placement"
	"github.com/warmfleet/warmfleet/schemas"
)

// simContent is a layer or artifact on a simulated node's disk.
type simContent struct {
	bytes int64
	// readyAt is when it is fetched (and, for a layer, unpacked).
	readyAt float64
}

// simHeld is an image or artifact a node keeps: what collection weighs.
type simHeld struct {
	lastUsed float64
	// pins are the booked and running Runs that use it; collection never
	// takes a pinned one.
	pins int
}

// simNode is one node of the simulated fleet: its cards, its disk and its
// two links (registry and artifact store), each moving one fetch at a
// time, and the Runs booked on it.
type simNode struct {
	id     string
	cards  []string // GPU UUIDs, by index
	holder []int    // run holding each card, -1 when free
	layers map[int]*simContent
	arts   map[int]*simContent
	// images are the images pulled onto the node (layers may be shared).
	images map[int]*simHeld
	artUse map[int]*simHeld
	used   int64
	// pullFree, unpackFree and artFree are when the registry link, the
	// unpacker and the artifact link are next idle.
	pullFree, unpackFree, artFree float64
	running                       []int // booked with cards: fetching or running
	queued                        []int // waiting on this node, in order
	evictions                     int
}

func (n *simNode) freeCards() int {
	free := 0
	for _, h := range n.holder {
		if h < 0 {
			free++
		}
	}
	return free
}

// take gives run the first count free cards, in index order, as placement's
// PickGPUs chooses them.
func (n *simNode) take(run, count int) []string {
	var got []string
	for i, h := range n.holder {
		if len(got) == count {
			break
		}
		if h < 0 {
			n.holder[i] = run
			got = append(got, n.cards[i])
		}
	}
	return got
}

func (n *simNode) release(run int) {
	for i, h := range n.holder {
		if h == run {
			n.holder[i] = -1
		}
	}
}

// fetch starts moving what run needs that the node lacks, pins it, and
// returns when all of it is on the node and the bytes it moved. Missing
// layers queue on the registry link and then on the unpacker, in order;
// a layer already there or on its way costs nothing more.
func (s *simulator) fetch(n *simNode, run int, now float64) (readyAt float64, pulled, fetched int64) {
	r, f := s.runs[run], s.trace.Fleet
	readyAt = now
	im := s.cat.images[r.image]
	for _, l := range im.layers {
		c := n.layers[l]
		if c == nil {
			b := s.cat.layerBytes[l]
			got := max(now, n.pullFree) + float64(b)/f.PullBytesPerSecond
			n.pullFree = got
			n.unpackFree = max(got, n.unpackFree) + float64(b)/f.UnpackBytesPerSecond
			c = &simContent{bytes: b, readyAt: n.unpackFree}
			n.layers[l] = c
			n.used += b
			pulled += b
		}
		readyAt = max(readyAt, c.readyAt)
	}
	h := n.images[r.image]
	if h == nil {
		h = &simHeld{}
		n.images[r.image] = h
	}
	h.pins++
	h.lastUsed = now
	if r.artifact >= 0 {
		c := n.arts[r.artifact]
		if c == nil {
			b := s.cat.artifacts[r.artifact].bytes
			n.artFree = max(now, n.artFree) + float64(b)/f.ArtifactBytesPerSecond
			c = &simContent{bytes: b, readyAt: n.artFree}
			n.arts[r.artifact] = c
			n.used += b
			fetched += b
		}
		readyAt = max(readyAt, c.readyAt)
		a := n.artUse[r.artifact]
		if a == nil {
			a = &simHeld{}
			n.artUse[r.artifact] = a
		}
		a.pins++
		a.lastUsed = now
	}
	s.collect(n)
	return readyAt, pulled, fetched
}

// unpin marks run's image and artifact no longer in use on n.
func (s *simulator) unpin(n *simNode, run int, now float64) {
	r := s.runs[run]
	if h := n.images[r.image]; h != nil {
		h.pins--
		h.lastUsed = now
	}
	if r.artifact >= 0 {
		if a := n.artUse[r.artifact]; a != nil {
			a.pins--
			a.lastUsed = now
		}
	}
}

// collect is the node's disk collection: past the high watermark it removes
// unpinned images and artifacts, least recently used first, until it is at
// or below the low one. A layer goes with the last image that uses it.
func (s *simulator) collect(n *simNode) {
	f := s.trace.Fleet
	high, low := f.DiskBytes/100*int64(f.HighWatermark), f.DiskBytes/100*int64(f.LowWatermark)
	if n.used <= high {
		return
	}
	type victim struct {
		image    bool
		id       int
		lastUsed float64
	}
	var vs []victim
	for id, h := range n.images {
		if h.pins == 0 {
			vs = append(vs, victim{true, id, h.lastUsed})
		}
	}
	for id, a := range n.artUse {
		if a.pins == 0 {
			vs = append(vs, victim{false, id, a.lastUsed})
		}
	}
	slices.SortFunc(vs, func(a, b victim) int {
		if c := cmpFloat(a.lastUsed, b.lastUsed); c != 0 {
			return c
		}
		if a.image != b.image {
			if a.image {
				return -1
			}
			return 1
		}
		return a.id - b.id
	})
	for _, v := range vs {
		if n.used <= low {
			break
		}
		n.evictions++
		if !v.image {
			n.used -= n.arts[v.id].bytes
			delete(n.arts, v.id)
			delete(n.artUse, v.id)
			continue
		}
		delete(n.images, v.id)
		for _, l := range s.cat.images[v.id].layers {
			if !s.layerInUse(n, l) {
				n.used -= n.layers[l].bytes
				delete(n.layers, l)
			}
		}
	}
}

func (s *simulator) layerInUse(n *simNode, l int) bool {
	for id := range n.images {
		if slices.Contains(s.cat.images[id].layers, l) {
			return true
		}
	}
	return false
}

// hot reports whether every layer of image is on n and unpacked at now:
// what the node's facts list as a hot image.
func (s *simulator) hot(n *simNode, image int, now float64) bool {
	if n.images[image] == nil {
		return false
	}
	for _, l := range s.cat.images[image].layers {
		if c := n.layers[l]; c == nil || c.readyAt > now {
			return false
		}
	}
	return true
}

// Per-GPU CPU and memory: Runs ask for both in proportion to their cards.
const (
	simCPUPerGPU = 8000
	simMemPerGPU = 64 << 30
)

// snapshot is the fleet as placement sees it at now: each node's facts
// (hot images, replicas, free disk) and its bookings, built as the
// scheduler builds its snapshot.
func (s *simulator) snapshot(now float64) *placement.Fleet {
	at := s.clock(now)
	f := s.trace.Fleet
	support := &schemas.NodeSupport{ContainerRuntime: "sim", ExactImageInventory: true, Prewarm: true, GarbageCollection: true,
		DiskWatermarks: &schemas.DiskWatermarks{High: f.HighWatermark, Low: f.LowWatermark}, ArtifactReplicas: true}
	nodes := make([]*placement.Node, len(s.nodes))
	for i, n := range s.nodes {
		facts := &schemas.NodeFacts{Host: schemas.HostFacts{OS: "linux", Architecture: "amd64",
			Accelerator: s.accel[i],
			Disk:        schemas.DiskFacts{Known: true, TotalBytes: f.DiskBytes, FreeBytes: max(0, f.DiskBytes-n.used)}},
			Support: support, Artifacts: &schemas.ArtifactInventory{Enumerated: true}}
		for _, id := range sortedKeys(n.images) {
			if s.hot(n, id, now) {
				facts.Images = append(facts.Images, s.locality[id])
			}
		}
		for _, id := range sortedKeys(n.arts) {
			if c := n.arts[id]; c.readyAt <= now {
				a := s.cat.artifacts[id]
				facts.Artifacts.Replicas = append(facts.Artifacts.Replicas, schemas.ArtifactReplica{Digest: a.digest, SizeBytes: a.bytes, VerifiedAt: at})
			}
		}
		rec := schemas.NodeRecord{NodeID: n.id, State: schemas.NodeReady, FencingToken: 1, Generation: 1,
			Capacity:     schemas.Resources{CPUMillis: simCPUPerGPU * int64(len(n.cards)), MemoryBytes: simMemPerGPU * int64(len(n.cards)), GPUCount: int64(len(n.cards))},
			LeaseExpires: at.Add(time.Minute), Facts: facts, FactsReceivedAt: at}
		pn := placement.NewNode(rec)
		for _, run := range n.running {
			st := s.state[run]
			pn.Running = append(pn.Running, placement.Booking{RunID: s.runID(run), Resources: s.resources(run), GPUs: st.cards,
				ExpectedEnd: s.expectedEnd(run, now), Fetching: st.readyAt > now, ReadyAt: s.clock(st.expectReady)})
		}
		for _, run := range n.queued {
			st := s.state[run]
			pn.Queued = append(pn.Queued, placement.Booking{RunID: s.runID(run), Resources: s.resources(run), ExpectedEnd: s.expectedEnd(run, now),
				Fetching: st.readyAt > now, ReadyAt: s.clock(st.expectReady)})
		}
		nodes[i] = pn
	}
	return placement.NewFleet(nodes)
}

// expectedEnd is when the scheduler expects run to free its place: from
// its start once running, else from when it was booked (or now, queued),
// plus its declared max runtime or the placement default.
func (s *simulator) expectedEnd(run int, now float64) time.Time {
	st := s.state[run]
	start := now
	switch {
	case st.cards != nil && st.runningAt <= now:
		start = st.runningAt
	case st.cards != nil:
		start = st.cardsAt
	}
	d := s.cfg.UnknownRuntime
	if m := s.runs[run].maxRuntime; m > 0 {
		d = time.Duration(m) * time.Second
	}
	return s.clock(start).Add(d)
}

func (s *simulator) resources(run int) schemas.Resources {
	g := int64(s.runs[run].gpus)
	return schemas.Resources{CPUMillis: simCPUPerGPU * g, MemoryBytes: simMemPerGPU * g, GPUCount: g}
}

func (s *simulator) runID(run int) string { return fmt.Sprintf("run-%06d", run) }

// request is run as the scheduler hands it to placement.Decide.
func (s *simulator) request(run int) placement.Request {
	r := s.runs[run]
	im := s.cat.images[r.image]
	rr := schemas.RunRequest{RequestID: s.runID(run), Image: "registry.example/" + im.name + "@" + im.digest,
		Resources: s.resources(run), MaxRuntimeSeconds: r.maxRuntime}
	req := placement.Request{RunID: s.runID(run), Attempt: 1, Run: rr, Digest: im.digest}
	if r.artifact >= 0 {
		a := s.cat.artifacts[r.artifact]
		req.Run.Artifacts = []schemas.ArtifactUse{{Name: a.name, Path: "/weights"}}
		req.Artifacts = []schemas.ArtifactMount{{Name: a.name, Version: "v1", Digest: a.digest, SizeBytes: a.bytes,
			Source: schemas.ArtifactSource{Object: a.digest}, Path: "/weights"}}
	}
	return req
}

func sortedKeys[V any](m map[int]V) []int {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
