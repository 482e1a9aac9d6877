package placement

import (
	"iter"
	"slices"
	"strings"
	"time"
	"unique"

	"github.com/containerd/platforms"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/warmfleet/warmfleet/schemas"
)

// Booking is a Run that holds (running) or waits for (queued) a place on a
// node.
type Booking struct {
	RunID     string
	Resources schemas.Resources
	// ExpectedEnd is when the booking should free its place: its start plus
	// its max runtime, or Config.UnknownRuntime when it has none.
	ExpectedEnd time.Time
	// GPUs are the cards a running booking holds, by UUID; Want narrows
	// which cards a queued one can start on.
	GPUs []string
	Want *schemas.GPURequirement
	// Fetching marks a booking whose bytes are still on their way to the
	// node. A queued one claims cards only once they are there, so until
	// then it does not head the queue.
	Fetching bool
	// ReadyAt is when a fetching booking's bytes should all be there, as
	// its own decision estimated: the node's link is busy until then.
	ReadyAt time.Time
}

// Node is one node as placement sees it: its registry record and what is
// booked on it.
type Node struct {
	Record  schemas.NodeRecord
	Running []Booking
	Queued  []Booking

	// devices are the node's reported GPUs (AcceleratorFacts.Devices) and
	// gpuCount their total as AcceleratorFacts.GPUCount counts it: read
	// here, a decision does not touch the facts for them.
	devices  []cardKind
	gpuCount int64
	// cards are the node's cards by identity, in index order.
	cards []card
	// usableKinds counts the usable cards by model and memory: a node's
	// cards are usually one kind, so matching a request costs one string
	// search per kind rather than one per card.
	usableKinds []cardKind
	// support is what the node declared it can do (schemas.NodeFacts.Supports).
	support schemas.NodeSupport
	// build is the node's own platform, normalized (buildKey): the build
	// of an index it fetches for a Run that names none.
	build string
}

// card is one GPU as placement books it.
type card struct {
	uuid, model string // model lowercased
	memoryBytes int64
	// device is the CDI device that hands the card to a container; ""
	// when the agent cannot inject it.
	device  string
	healthy bool
}

// cardKind is a count of cards of one model and memory size.
type cardKind struct {
	// model is lowercased and interned: nodes share a few models, so a
	// decision matches each once (query.modelMatches) by handle.
	model       unique.Handle[string]
	memoryBytes int64
	count       int64
}

// usable reports whether the card can be booked to a workload.
func (c card) usable() bool { return c.healthy && c.device != "" }

// matches reports whether the card satisfies want (nil: any card); model
// is want.Model lowercased.
func (c card) matches(want *schemas.GPURequirement, model string) bool {
	return want == nil || ((model == "" || strings.Contains(c.model, model)) && c.memoryBytes >= want.MinMemoryBytes)
}

// NewNode wraps a node record for placement.
func NewNode(rec schemas.NodeRecord) *Node {
	n := &Node{Record: rec, support: rec.Facts.Supports()}
	if rec.Facts != nil {
		h := rec.Facts.Host
		n.build = buildKey(schemas.Platform{OS: h.OS, Architecture: h.Architecture, Variant: h.Variant})
		acc := rec.Facts.Host.Accelerator
		for _, d := range acc.Devices {
			n.devices = append(n.devices, cardKind{model: unique.Make(strings.ToLower(d.Model)), memoryBytes: d.MemoryBytes, count: d.Count})
		}
		n.gpuCount = acc.GPUCount()
		for _, c := range acc.Cards {
			cd := card{uuid: c.UUID, model: strings.ToLower(c.Model), memoryBytes: c.MemoryBytes,
				healthy: c.Health == "" || c.Health == schemas.GPUHealthOK}
			if len(c.CDIDevices) > 0 {
				cd.device = c.CDIDevices[0]
			}
			n.cards = append(n.cards, cd)
			if cd.usable() {
				n.countUsable(cd)
			}
		}
	}
	return n
}

func (n *Node) countUsable(c card) {
	for i := range n.usableKinds {
		if k := &n.usableKinds[i]; k.model.Value() == c.model && k.memoryBytes == c.memoryBytes {
			k.count++
			return
		}
	}
	n.usableKinds = append(n.usableKinds, cardKind{model: unique.Make(c.model), memoryBytes: c.memoryBytes, count: 1})
}

// MaxWorkloads is how many workloads the node runs at once, 0 for no cap:
// the lower of what it enrolled with and what its runtime declares
// (NodeSupport.MaxConcurrentWorkloads).
func (n *Node) MaxWorkloads() int {
	a, b := n.Record.MaxWorkloads, n.support.MaxConcurrentWorkloads
	switch {
	case a == 0:
		return b
	case b == 0:
		return a
	}
	return min(a, b)
}

// holdsCards reports whether any running booking holds a card.
func (n *Node) holdsCards() bool {
	for _, b := range n.Running {
		if len(b.GPUs) > 0 {
			return true
		}
	}
	return false
}

// held reports whether a running booking holds the card.
func (n *Node) held(uuid string) bool {
	for _, b := range n.Running {
		if slices.Contains(b.GPUs, uuid) {
			return true
		}
	}
	return false
}

// free yields the node's usable cards that match want (model is
// want.Model lowercased) and that no running booking holds, in index order.
func (n *Node) free(want *schemas.GPURequirement, model string) iter.Seq[card] {
	return func(yield func(card) bool) {
		for _, c := range n.cards {
			if c.usable() && c.matches(want, model) && !n.held(c.uuid) && !yield(c) {
				return
			}
		}
	}
}

// freeCards returns up to limit of the cards free yields.
func (n *Node) freeCards(want *schemas.GPURequirement, model string, limit int64) []card {
	var free []card
	for c := range n.free(want, model) {
		if int64(len(free)) == limit {
			break
		}
		free = append(free, c)
	}
	return free
}

// freeCount is len(freeCards(want, model, limit)) without building the list;
// usable is how many of the node's usable cards match want, held or not.
func (n *Node) freeCount(want *schemas.GPURequirement, model string, limit, usable int64) int64 {
	if !n.holdsCards() {
		// Nothing held: every matching usable card is free, so the
		// per-card search over the bookings is skipped.
		return min(limit, usable)
	}
	var count int64
	for range n.free(want, model) {
		if count == limit {
			break
		}
		count++
	}
	return count
}

// PickGPUs chooses count free cards matching want, in index order, and
// returns their UUIDs and CDI devices; ok is false when too few are free.
func (n *Node) PickGPUs(count int64, want *schemas.GPURequirement) (uuids, devices []string, ok bool) {
	if count <= 0 {
		return nil, nil, true
	}
	model := ""
	if want != nil {
		model = strings.ToLower(want.Model)
	}
	free := n.freeCards(want, model, count)
	if int64(len(free)) < count {
		return nil, nil, false
	}
	for _, c := range free {
		uuids, devices = append(uuids, c.uuid), append(devices, c.device)
	}
	return uuids, devices, true
}

func cacheKey(name, compat string) string { return name + "\x00" + compat }

// buildKey names a platform once normalized, so that arm64 and arm64/v8
// are one build.
func buildKey(p schemas.Platform) string {
	return platforms.Format(platforms.Normalize(ocispec.Platform{OS: p.OS, Architecture: p.Architecture, Variant: p.Variant}))
}

// hotKey indexes a hot image: by its digest, unless it is an index held as
// a build other than the node's own (a Run named it), which is hot only
// for Runs naming that build: digest|build.
func hotKey(im schemas.ImageLocality, nodeBuild string) string {
	if !im.Index {
		return im.ManifestDigest
	}
	if b := buildKey(im.Platform); b != nodeBuild {
		return im.ManifestDigest + "|" + b
	}
	return im.ManifestDigest
}

// imageRef is what the fleet knows of one image: its layers and their sizes.
// The platform is the image's own only for a single manifest: of an index
// it is just the build the first reporting node fetched, and says nothing of
// what the image needs.
type imageRef struct {
	platform schemas.Platform
	index    bool
	layers   []string
	sizes    []int64
	total    int64
}

// Fleet is a snapshot of every node, indexed the other way round from the
// facts: for each image, layer and cache, the set of nodes holding it. A
// decision then asks "does node i hold layer L" as one bit test instead of
// a map lookup in each node's facts, which is what keeps 10k nodes within
// milliseconds.
type Fleet struct {
	Nodes  []*Node
	pos    map[string]int
	images map[string]imageRef
	hot    map[string]bitset // hotKey → nodes holding it hot
	layers map[string]bitset // compressed layer digest → nodes holding it
	caches map[string]bitset // cache name/key → nodes holding it
	// cacheSize is the largest size seen for a cache name/key: what a node
	// without it would have to fill.
	cacheSize map[string]int64
	// artifacts are the nodes holding a verified replica, by digest, from
	// nodes that enumerated their replicas.
	artifacts map[string]bitset
}

// bitset is a set of node positions.
type bitset []uint64

func (b bitset) has(i int) bool { return i>>6 < len(b) && b[i>>6]&(1<<(uint(i)&63)) != 0 }

func (f *Fleet) set(m map[string]bitset, key string, i int) {
	b := m[key]
	if b == nil {
		b = make(bitset, (len(f.Nodes)+63)/64)
		m[key] = b
	}
	b[i>>6] |= 1 << (uint(i) & 63)
}

// NewFleet indexes nodes.
func NewFleet(nodes []*Node) *Fleet {
	f := &Fleet{Nodes: nodes, pos: make(map[string]int, len(nodes)), images: map[string]imageRef{},
		hot: map[string]bitset{}, layers: map[string]bitset{}, caches: map[string]bitset{}, cacheSize: map[string]int64{},
		artifacts: map[string]bitset{}}
	for i, n := range nodes {
		f.pos[n.Record.NodeID] = i
		if n.Record.Facts == nil {
			continue
		}
		for _, im := range n.Record.Facts.Images {
			f.learn(im)
			if !n.support.ExactImageInventory {
				// Its locality is an estimate: it teaches sizes, but
				// placement counts no warmth on it.
				continue
			}
			if im.State == schemas.LocalityHot {
				f.set(f.hot, hotKey(im, n.build), i)
			}
			if im.State == schemas.LocalityHot || im.ContentPresent {
				for _, l := range im.LayerDigests {
					f.set(f.layers, l, i)
				}
			}
		}
		for _, c := range n.Record.Facts.Caches {
			k := cacheKey(c.Name, c.CompatibilityKey)
			f.set(f.caches, k, i)
			f.cacheSize[k] = max(f.cacheSize[k], c.SizeBytes)
		}
		// A node that did not enumerate says nothing: it holds no bit, so
		// the fetch is priced, and it is not refused.
		if inv := n.Record.Facts.Artifacts; inv != nil && inv.Enumerated && n.support.ArtifactReplicas {
			for _, r := range inv.Replicas {
				f.set(f.artifacts, r.Digest, i)
			}
		}
	}
	return f
}

// learn records an image's layers and sizes: the first node to report them
// teaches every decision how big the image is.
func (f *Fleet) learn(im schemas.ImageLocality) {
	if _, ok := f.images[im.ManifestDigest]; ok || len(im.LayerSizes) == 0 {
		return
	}
	ref := imageRef{index: im.Index, layers: im.LayerDigests, sizes: im.LayerSizes}
	if !im.Index {
		ref.platform = im.Platform
	}
	for _, s := range im.LayerSizes {
		ref.total += s
	}
	f.images[im.ManifestDigest] = ref
}

// Node returns the node with id, or nil.
func (f *Fleet) Node(id string) *Node {
	if i, ok := f.pos[id]; ok {
		return f.Nodes[i]
	}
	return nil
}

// Book records a booking just made (with the cards it holds, when it
// runs), so later decisions in the same pass see it.
func (f *Fleet) Book(nodeID string, b Booking, queued bool) {
	n := f.Node(nodeID)
	if n == nil {
		return
	}
	if queued {
		n.Queued = append(n.Queued, b)
	} else {
		n.Running = append(n.Running, b)
	}
}

// Start moves a queued booking to running, holding gpus.
func (f *Fleet) Start(nodeID, runID string, gpus []string) {
	n := f.Node(nodeID)
	if n == nil {
		return
	}
	for i, q := range n.Queued {
		if q.RunID == runID {
			n.Queued = append(n.Queued[:i:i], n.Queued[i+1:]...)
			q.GPUs = gpus
			n.Running = append(n.Running, q)
			return
		}
	}
}

// MayWin reports whether any node is ready, leased at now, and large
// enough for need. Decide can name a winner only among such nodes, so when
// MayWin is false the decision is "no node fits" however it is scored; a
// caller that only records that answer can skip Decide for the others.
func (f *Fleet) MayWin(need schemas.Resources, now time.Time) bool {
	for _, n := range f.Nodes {
		rec := &n.Record
		if rec.State == schemas.NodeReady && now.Before(rec.LeaseExpires) &&
			need.CPUMillis <= rec.Capacity.CPUMillis && need.MemoryBytes <= rec.Capacity.MemoryBytes && need.GPUCount <= rec.Capacity.GPUCount {
			return true
		}
	}
	return false
}
