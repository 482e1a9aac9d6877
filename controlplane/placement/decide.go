package placement

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unique"

	"github.com/containerd/platforms"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/warmfleet/warmfleet/schemas"
)

// MaxQueued is how many bookings may wait on a node behind the running ones.
const MaxQueued = 4

// Config weighs time against money and says how fast bytes move.
type Config struct {
	// PullBytesPerSecond is the assumed registry → node bandwidth.
	PullBytesPerSecond float64
	// CacheBytesPerSecond is how fast a missing cache is filled.
	CacheBytesPerSecond float64
	// ArtifactBytesPerSecond is the assumed artifact source → node
	// bandwidth.
	ArtifactBytesPerSecond float64
	// UnknownImageBytes is assumed for an image no node has reported.
	UnknownImageBytes int64
	// UnknownRuntime is how long a booking without max_runtime_seconds is
	// assumed to hold its place.
	UnknownRuntime time.Duration
	// SecondsPerDollarHour converts price into start-time seconds: a node
	// $1/hour dearer must start this many seconds sooner to win.
	SecondsPerDollarHour float64
	// FactsMaxAge is how old a node's facts may be before it is not
	// trusted with a booking.
	FactsMaxAge time.Duration
	// WholeNodeSeconds is added to the cost of starting a Run on a node
	// whose GPUs are all free when the Run needs fewer than all of them
	// and a partly used node could start it now: taking part of the last
	// whole nodes makes a later Run that needs a whole node wait for one
	// to drain. The partly used node wins unless the whole one starts the
	// Run this much sooner. Zero or less prices
	// nothing (controlplane.Config gives 0 the default: set it negative
	// there to turn this off).
	WholeNodeSeconds float64
}

// DefaultConfig is what the control plane uses unless configured.
func DefaultConfig() Config {
	return Config{
		PullBytesPerSecond:     100e6,
		CacheBytesPerSecond:    200e6,
		ArtifactBytesPerSecond: 100e6,
		UnknownImageBytes:      1 << 30,
		UnknownRuntime:         10 * time.Minute,
		SecondsPerDollarHour:   60,
		FactsMaxAge:            2 * time.Minute,
		WholeNodeSeconds:       30,
	}
}

// Request is one Run to place.
type Request struct {
	RunID   string
	Attempt int
	Run     schemas.RunRequest
	// Digest is the image's manifest digest (from Run.Image).
	Digest string
	// Artifacts are the Run's artifacts as intake resolved them
	// (schemas.Run.Artifacts): their sizes price a node that lacks them.
	Artifacts []schemas.ArtifactMount
}

// Decide scores every node for req and returns the decision: the winner
// (lowest cost) and every other node with its reason.
func Decide(req Request, fleet *Fleet, now time.Time, cfg Config) schemas.BookingDecision {
	// Candidates are scored in place: returning and appending each one
	// copied 10k of them twice, most of a decision's time.
	d := schemas.BookingDecision{RunID: req.RunID, Attempt: req.Attempt, DecidedAt: now, Candidates: make([]schemas.Candidate, len(fleet.Nodes))}
	q := query{req: req, cfg: cfg, now: now, hot: fleet.hot[req.Digest]}
	q.ref, q.refKnown = fleet.images[req.Digest]
	for _, l := range q.ref.layers {
		q.layerHolders = append(q.layerHolders, fleet.layers[l])
	}
	for _, cm := range req.Run.Caches {
		k := cacheKey(cm.Name, cm.CompatibilityKey)
		q.cacheHolders = append(q.cacheHolders, fleet.caches[k])
		q.cacheSizes = append(q.cacheSizes, fleet.cacheSize[k])
	}
	for _, a := range req.Artifacts {
		q.artifactHolders = append(q.artifactHolders, fleet.artifacts[a.Digest])
	}
	if req.Run.GPU != nil {
		q.model = strings.ToLower(req.Run.GPU.Model)
	}
	if p := wantPlatform(&q.req, &q.ref, q.refKnown); p != nil {
		q.platform, q.needsPlatform = *p, true
	}
	q.network = schemas.NetworkModeOf(req.Run.Network)
	if p := req.Run.Platform; p != nil && q.refKnown && q.ref.index {
		q.named = buildKey(*p)
		q.hotAs = fleet.hot[req.Digest+"|"+q.named]
	}
	best, fitsNow := -1, false
	queued := make([]bool, len(fleet.Nodes))
	// soonest and second are the two lowest costs of eligible nodes were
	// they free now.
	soonest, second := math.Inf(1), math.Inf(1)
	whole := make([]bool, len(fleet.Nodes))
	partlyUsedFits := false
	for i, n := range fleet.Nodes {
		c := &d.Candidates[i]
		busy := q.evaluate(i, n, c)
		w := wholeNode(c, busy, n, req.Run.Resources.GPUCount)
		queued[i], whole[i] = busy, w
		partlyUsedFits = partlyUsedFits || (c.Eligible && !busy && req.Run.Resources.GPUCount > 0 && !w)
	}
	wholeDetail := ""
	for i := range d.Candidates {
		c := &d.Candidates[i]
		if !c.Eligible {
			continue
		}
		if whole[i] && partlyUsedFits && cfg.WholeNodeSeconds > 0 {
			// Only where a partly used node could start the Run now: were
			// every free node whole, the price would send it to a queue.
			if wholeDetail == "" {
				// One string for every such node: formatting one each
				// would cost a decision over 10k nodes thousands of
				// allocations.
				wholeDetail = fmt.Sprintf("all GPUs free: +%.0fs for breaking a whole node while a partly used one fits (the Run needs %d)",
					cfg.WholeNodeSeconds, req.Run.Resources.GPUCount)
			}
			c.Cost += cfg.WholeNodeSeconds
			c.Detail = wholeDetail
		}
		busy := queued[i]
		fitsNow = fitsNow || !busy
		if best < 0 || better(*c, d.Candidates[best]) {
			best = i
		}
		if free := costIfFree(*c); free < soonest {
			soonest, second = free, soonest
		} else if free < second {
			second = free
		}
	}
	if best >= 0 && !fitsNow {
		// Every node is busy. A queued booking stays on its node, and a
		// node with a queue starts nobody else, so the best queue is
		// booked only when no other node could start the Run sooner even
		// were it free now (queue estimates come from max runtimes:
		// upper bounds). Otherwise the Run waits unbooked and takes the
		// first node to free.
		w := d.Candidates[best]
		other := soonest
		if costIfFree(w) == soonest {
			other = second
		}
		if w.Cost > other {
			best = -1
			for i := range d.Candidates {
				if c := &d.Candidates[i]; c.Eligible {
					c.Eligible, c.Reason = false, schemas.ReasonAtCapacity
					c.Detail = fmt.Sprintf("busy: the Run would start here in about %.0fs; every node is busy and one could start it in %.0fs were it free, so it waits for the first to free rather than in one node's queue", c.Components.StartSeconds, other)
				}
			}
		}
	}
	// Candidates stay in fleet order: sorting 10k of them would cost more
	// than scoring them. Readers (the CLI) sort for display.
	if best >= 0 {
		w := d.Candidates[best]
		d.Winner, d.WinnerQueued = w.NodeID, queued[best]
		if !d.WinnerQueued {
			d.GPUs, _, _ = fleet.Node(w.NodeID).PickGPUs(req.Run.Resources.GPUCount, req.Run.GPU)
		}
		for i := range d.Candidates {
			if c := &d.Candidates[i]; c.Eligible && i != best {
				c.Reason = schemas.ReasonOutscored // Cost beside the winner's says by how much
			}
		}
	}
	return d
}

// wholeNode reports whether the Run, needing gpus but fewer than the
// node has, fits now on node n whose GPUs are all free.
func wholeNode(c *schemas.Candidate, busy bool, n *Node, gpus int64) bool {
	all := n.Record.Capacity.GPUCount
	return c.Eligible && !busy && gpus > 0 && gpus < all && c.Free.GPUCount == all
}

// better reports whether candidate a beats b: the lower cost, then the
// lower id.
func better(a, b schemas.Candidate) bool {
	return a.Cost < b.Cost || (a.Cost == b.Cost && a.NodeID < b.NodeID)
}

// costIfFree is c's cost were its node free now: its fetches and price,
// no queue.
func costIfFree(c schemas.Candidate) float64 {
	k := c.Components
	return c.Cost - k.StartSeconds + k.PullSeconds + k.CacheSeconds + k.ArtifactSeconds
}

// query is one decision's request with the fleet's indexes looked up once:
// the holders of the image, of each of its layers and of each cache.
type query struct {
	req          Request
	cfg          Config
	now          time.Time
	ref          imageRef
	refKnown     bool
	hot          bitset
	layerHolders []bitset
	cacheHolders []bitset
	cacheSizes   []int64
	// artifactHolders are the nodes holding each of req.Artifacts.
	artifactHolders []bitset
	model           string
	// platform is the build the Run needs (wantPlatform) when
	// needsPlatform, and network the mode it asks for.
	platform      schemas.Platform
	needsPlatform bool
	network       string
	// seen, lastModel and lastMatch are modelMatches' last answer.
	seen      bool
	lastModel unique.Handle[string]
	lastMatch bool
	// named is the build of an index the Run names (buildKey), and hotAs
	// the nodes holding the index hot as that build when it is not their
	// own; "" when the Run names none or the image is no index.
	named string
	hotAs bitset
}

// evaluate applies the hard constraints in a fixed order (the first that
// fails is the reason) and then scores node i into c, which must be zero;
// queued reports that the Run does not fit there now and would wait in the
// node's queue.
func (q *query) evaluate(i int, n *Node, c *schemas.Candidate) (queued bool) {
	// Pointers, not copies: the request and config are read for every node.
	req, cfg, now, ref, refKnown := &q.req, &q.cfg, q.now, &q.ref, q.refKnown
	rec := &n.Record
	need := req.Run.Resources
	var reserved schemas.Resources
	for _, b := range n.Running {
		reserved = reserved.Add(b.Resources)
	}
	free := rec.Capacity.Sub(reserved)
	c.NodeID, c.Free = rec.NodeID, free
	reject := func(code schemas.Code, format string, args ...any) bool {
		c.Reason, c.Detail = code, fmt.Sprintf(format, args...)
		return false
	}
	var host *schemas.HostFacts
	if rec.Facts != nil {
		host = &rec.Facts.Host
	} else {
		host = &schemas.HostFacts{}
	}

	switch {
	case rec.State == schemas.NodeDraining:
		return reject(schemas.ReasonNodeDraining, "node is draining")
	case rec.State != schemas.NodeReady:
		return reject(schemas.ReasonNodeNotReady, "node is %s", rec.State)
	case !now.Before(rec.LeaseExpires):
		return reject(schemas.ReasonLeaseStale, "no heartbeat since the lease expired at %s", rec.LeaseExpires.UTC().Format(time.RFC3339))
	case rec.Facts == nil || now.Sub(rec.FactsReceivedAt) > cfg.FactsMaxAge:
		return reject(schemas.ReasonFactsStale, "facts are older than %s", cfg.FactsMaxAge)
	}
	if q.needsPlatform && !runsOn(host, q.platform) {
		return reject(schemas.ReasonPlatformMismatch, "needs %s, node is %s", q.platform.String(), hostPlatform(host).String())
	}
	if mode := q.network; len(host.NetworkModes) > 0 && !slices.Contains(host.NetworkModes, mode) {
		return reject(schemas.ReasonNetworkUnavailable, "needs network %s; node offers %s", mode, strings.Join(host.NetworkModes, ", "))
	}
	if len(req.Run.Caches) > 0 && !n.support.CacheMounts {
		return reject(schemas.ReasonCacheMountsUnsupported, "mounts %d cache(s); node's runtime %q declares no cache mounts", len(req.Run.Caches), n.support.ContainerRuntime)
	}
	if len(req.Artifacts) > 0 && !n.support.ArtifactReplicas {
		return reject(schemas.ReasonArtifactsUnsupported, "mounts %d artifact(s); node's agent declares no artifact replica store", len(req.Artifacts))
	}
	fetch, warm := q.artifactFetch(i)
	if fetch > 0 && host.Disk.Known && host.Disk.FreeBytes < fetch+need.DiskBytes {
		return reject(schemas.ReasonInsufficientDisk, "needs %d free bytes for artifacts it would fetch (plus %d asked), node has %d", fetch, need.DiskBytes, host.Disk.FreeBytes)
	}
	var usable int64 // matching usable cards, held or not
	if need.GPUCount > 0 {
		acc := &host.Accelerator
		if req.Run.GPU != nil && req.Run.GPU.MinDriverCapability != "" {
			switch {
			case acc.Vendor == "":
				return reject(schemas.ReasonDriverMissing, "needs driver capability %s; node has no accelerator driver", req.Run.GPU.MinDriverCapability)
			case versionLess(acc.DriverCapability, req.Run.GPU.MinDriverCapability):
				return reject(schemas.ReasonDriverTooOld, "needs driver capability %s, node has %s", req.Run.GPU.MinDriverCapability, acc.DriverCapability)
			}
		}
		if matching := q.gpuMatches(n); matching < need.GPUCount {
			if req.Run.GPU != nil && (req.Run.GPU.Model != "" || req.Run.GPU.MinMemoryBytes > 0) && acc.GPUCount() >= need.GPUCount {
				return reject(schemas.ReasonGPUModelMismatch, "needs %d × %s; node has %s", need.GPUCount, gpuWant(req.Run.GPU), describeGPUs(*acc))
			}
			return reject(schemas.ReasonInsufficientGPU, "needs %d GPUs; node has %d", need.GPUCount, matching)
		}
		usable = q.usableCards(n)
		if usable < need.GPUCount {
			return reject(schemas.ReasonGPUNotInjectable, "needs %d GPUs it can hand a container; %d of the node's matching cards have a CDI device and are healthy (see the node's facts)", need.GPUCount, usable)
		}
	}
	if need.DiskBytes > 0 {
		switch {
		case !host.Disk.Known:
			return reject(schemas.ReasonDiskUnknown, "needs %d free bytes; node could not measure its disk", need.DiskBytes)
		case host.Disk.FreeBytes < need.DiskBytes:
			return reject(schemas.ReasonInsufficientDisk, "needs %d free bytes, node has %d", need.DiskBytes, host.Disk.FreeBytes)
		}
	}
	// Capacity the node could ever give, then what it gives now.
	switch {
	case need.CPUMillis > rec.Capacity.CPUMillis:
		return reject(schemas.ReasonInsufficientCPU, "needs %dm CPU, node offers %dm", need.CPUMillis, rec.Capacity.CPUMillis)
	case need.MemoryBytes > rec.Capacity.MemoryBytes:
		return reject(schemas.ReasonInsufficientMemory, "needs %d bytes of memory, node offers %d", need.MemoryBytes, rec.Capacity.MemoryBytes)
	case need.GPUCount > rec.Capacity.GPUCount:
		return reject(schemas.ReasonInsufficientGPU, "needs %d GPUs, node offers %d", need.GPUCount, rec.Capacity.GPUCount)
	}
	queue := 0.0
	slots := n.MaxWorkloads()
	fitsNow := need.Fits(free) && (slots == 0 || len(n.Running) < slots) && len(n.Queued) == 0
	if fitsNow && need.GPUCount > 0 {
		fitsNow = n.freeCount(req.Run.GPU, q.model, need.GPUCount, usable) == need.GPUCount
	}
	if !fitsNow {
		if len(n.Queued) >= MaxQueued {
			return reject(schemas.ReasonQueueFull, "%d bookings already wait on this node", len(n.Queued))
		}
		queue = waitSeconds(n, need, now, cfg)
	}

	// Score: seconds until the workload could start, plus price.
	comp := &c.Components
	comp.QueueSeconds, comp.PricePerHour = queue, rec.PricePerHour
	hot := q.hot.has(i)
	if q.named != "" && q.named != n.build {
		hot = q.hotAs.has(i)
	}
	switch {
	case hot:
		comp.ImageState = string(schemas.LocalityHot)
	case refKnown:
		for j, holders := range q.layerHolders {
			if !holders.has(i) {
				comp.PullBytes += ref.sizes[j]
			}
		}
		comp.ImageState = string(schemas.LocalityCold)
		if comp.PullBytes < ref.total {
			comp.ImageState = string(schemas.LocalityPartial)
		}
	default:
		comp.PullBytes, comp.ImageState = cfg.UnknownImageBytes, string(schemas.LocalityUnknown)
	}
	comp.PullSeconds = float64(comp.PullBytes) / cfg.PullBytesPerSecond
	for j, holders := range q.cacheHolders {
		if holders.has(i) {
			comp.CachesWarm++
			continue
		}
		comp.CacheFillBytes += q.cacheSizes[j]
	}
	comp.CacheSeconds = float64(comp.CacheFillBytes) / cfg.CacheBytesPerSecond
	comp.ArtifactsWarm, comp.ArtifactFetchBytes = warm, fetch
	if fetch > 0 && cfg.ArtifactBytesPerSecond > 0 {
		comp.ArtifactSeconds = float64(fetch) / cfg.ArtifactBytesPerSecond
	}
	// A queued booking prefetches while it waits, so only the longer of the
	// two counts.
	comp.StartSeconds = max(comp.QueueSeconds, comp.PullSeconds+comp.CacheSeconds+comp.ArtifactSeconds)
	c.Eligible, c.Cost = true, comp.StartSeconds+cfg.SecondsPerDollarHour*comp.PricePerHour
	return !fitsNow
}

// artifactFetch returns the bytes of the Run's artifacts node i would
// still fetch, and how many it already holds.
func (q *query) artifactFetch(i int) (fetch int64, warm int) {
	for j, holders := range q.artifactHolders {
		if holders.has(i) {
			warm++
			continue
		}
		fetch += q.req.Artifacts[j].SizeBytes
	}
	return fetch, warm
}

// gpuMatches counts the node's GPUs that satisfy the request.
func (q *query) gpuMatches(n *Node) int64 {
	if q.req.Run.GPU == nil {
		return n.gpuCount
	}
	var count int64
	for _, d := range n.devices {
		if q.kindMatches(d) {
			count += d.count
		}
	}
	return count
}

// usableCards counts the node's cards that match the request and can be
// booked (healthy, with a CDI device), held or not.
func (q *query) usableCards(n *Node) int64 {
	var count int64
	for _, k := range n.usableKinds {
		if q.req.Run.GPU == nil || q.kindMatches(k) {
			count += k.count
		}
	}
	return count
}

// kindMatches reports whether cards of kind k satisfy the request's
// GPU requirement, which must not be nil (card.matches, by kind).
func (q *query) kindMatches(k cardKind) bool {
	return k.memoryBytes >= q.req.Run.GPU.MinMemoryBytes && q.modelMatches(k.model)
}

// modelMatches reports whether model contains the requested one. The last
// answer is kept: a fleet has few models, so the search runs about once
// per decision rather than twice per node.
func (q *query) modelMatches(model unique.Handle[string]) bool {
	if q.model == "" {
		return true
	}
	if !q.seen || model != q.lastModel {
		q.seen, q.lastModel, q.lastMatch = true, model, strings.Contains(model.Value(), q.model)
	}
	return q.lastMatch
}

// waitSeconds estimates when enough running bookings end for need to fit
// behind whatever is already queued on the node (queued bookings start
// first, in order).
func waitSeconds(n *Node, need schemas.Resources, now time.Time, cfg *Config) float64 {
	// A node runs a few bookings: sorting a copy on the stack spares an
	// allocation per busy node.
	var buf [8]Booking
	running := append(buf[:0], n.Running...)
	for i, b := range running {
		if !b.ExpectedEnd.After(now) {
			// Past its expected end yet still booked (a long fetch, or
			// no max runtime): it is assumed to hold its place as long
			// again as a booking without one.
			running[i].ExpectedEnd = now.Add(cfg.UnknownRuntime)
		}
	}
	slices.SortFunc(running, func(a, b Booking) int { return a.ExpectedEnd.Compare(b.ExpectedEnd) })
	free := n.Record.Capacity
	for _, b := range running {
		free = free.Sub(b.Resources)
	}
	want := need
	for _, q := range n.Queued {
		want = want.Add(q.Resources)
	}
	slots, active := n.MaxWorkloads(), len(running)+len(n.Queued)
	at := now
	for i := 0; !want.Fits(free) || (slots > 0 && active >= slots); i++ {
		if i == len(running) {
			// Even an empty node cannot hold the queue and this Run at
			// once: the queue must run first.
			return at.Sub(now).Seconds() + cfg.UnknownRuntime.Seconds()
		}
		free, active = free.Add(running[i].Resources), active-1
		if running[i].ExpectedEnd.After(at) {
			at = running[i].ExpectedEnd
		}
	}
	return at.Sub(now).Seconds()
}

// wantPlatform is the platform the Run needs: its own, else its image's.
func wantPlatform(req *Request, ref *imageRef, known bool) *schemas.Platform {
	if req.Run.Platform != nil {
		return req.Run.Platform
	}
	if known && ref.platform.OS != "" {
		return &ref.platform
	}
	return nil
}

// runsOn says whether a host runs build want: the same os and architecture
// once normalized (OCI's rules, as containerd applies them: arm64 is
// arm64/v8, arm is arm/v7, amd64/v1 is amd64), and a variant the host's own
// build accepts (arm/v7 runs v6 and v5, amd64/v3 runs v2 and v1). A host of
// another architecture never does, even where containerd would run it
// (arm on arm64, 386 on amd64): not every CPU of that architecture can.
func runsOn(host *schemas.HostFacts, want schemas.Platform) bool {
	if want.Variant == host.Variant && want.OS == host.OS && want.Architecture == host.Architecture {
		return true // the common case, without allocating matchers
	}
	h := platforms.Normalize(ocispec.Platform{OS: host.OS, Architecture: host.Architecture, Variant: host.Variant})
	w := platforms.Normalize(ocispec.Platform{OS: want.OS, Architecture: want.Architecture, Variant: want.Variant})
	return h.OS == w.OS && h.Architecture == w.Architecture && platforms.Only(h).Match(w)
}

func hostPlatform(h *schemas.HostFacts) schemas.Platform {
	return schemas.Platform{OS: h.OS, Architecture: h.Architecture, Variant: h.Variant}
}

// versionLess compares dotted versions numerically ("12.10" > "12.4").
func versionLess(have, want string) bool {
	h, w := strings.Split(have, "."), strings.Split(want, ".")
	for i := range max(len(h), len(w)) {
		var a, b int
		if i < len(h) {
			a, _ = strconv.Atoi(h[i])
		}
		if i < len(w) {
			b, _ = strconv.Atoi(w[i])
		}
		if a != b {
			return a < b
		}
	}
	return false
}

func gpuWant(g *schemas.GPURequirement) string {
	s := g.Model
	if s == "" {
		s = "any model"
	}
	if g.MinMemoryBytes > 0 {
		s += fmt.Sprintf(" with ≥%d bytes", g.MinMemoryBytes)
	}
	return s
}

func describeGPUs(a schemas.AcceleratorFacts) string {
	if len(a.Devices) == 0 {
		return "none"
	}
	var parts []string
	for _, d := range a.Devices {
		parts = append(parts, fmt.Sprintf("%d × %s (%d bytes)", d.Count, d.Model, d.MemoryBytes))
	}
	return strings.Join(parts, ", ")
}
