package placement

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unique"

	"github.com/warmfleet/warmfleet/schemas"
)

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
	// idleRate prices a second the Run's cards wait on its bytes
	// (idleGPURate).
	idleRate float64
}

// newQuery looks req up in fleet's indexes once for the whole decision.
func newQuery(req Request, fleet *Fleet, now time.Time, cfg Config) query {
	q := query{req: req, cfg: cfg, now: now, hot: fleet.hot[req.Digest], idleRate: idleGPURate(&cfg, req.Run.Resources.GPUCount)}
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
	return q
}

// evaluate applies the hard constraints in a fixed order (the first that
// fails is the reason) and then scores node i into c, which must be zero;
// queued reports that the Run does not fit there now and would wait in the
// node's queue.
func (q *query) evaluate(i int, n *Node, c *schemas.Candidate) (queued bool) {
	rec := &n.Record
	var reserved schemas.Resources
	for _, b := range n.Running {
		reserved = reserved.Add(b.Resources)
	}
	free := rec.Capacity.Sub(reserved)
	// What the bookings fetching their bytes here will claim is not free
	// for packing (whole-node price, fuller-node ties), though a Run that
	// starts now may take it (queueFor).
	inQueue := n.queuedByReadiness()
	c.NodeID, c.Free = rec.NodeID, nonNegative(free.Sub(inQueue.fetching))
	if !q.admits(rec, c) {
		return false
	}
	host := &rec.Facts.Host // admits refuses a node without facts
	if !q.supports(n, host, c) {
		return false
	}
	fetch, warm := q.artifactFetch(i)
	if need := &q.req.Run.Resources; fetch > 0 && host.Disk.Known && host.Disk.FreeBytes < fetch+need.DiskBytes {
		return reject(c, schemas.ReasonInsufficientDisk, "needs %d free bytes for artifacts it would fetch (plus %d asked), node has %d", fetch, need.DiskBytes, host.Disk.FreeBytes)
	}
	usable, ok := q.cards(n, host, c)
	if !ok || !q.fitsEver(rec, host, c) {
		return false
	}
	fetching := q.fetches(i, n, c, fetch, warm)
	first := fetchesFirst(n, c)
	queue, fitsNow, ok := q.queueFor(n, inQueue, free, usable, first, c)
	if !ok {
		c.Components = schemas.ScoreComponents{}
		return false
	}
	q.score(n, c, queue, fetching, first)
	return !fitsNow
}

// nonNegative clamps r's counts at zero.
func nonNegative(r schemas.Resources) schemas.Resources {
	r.CPUMillis, r.MemoryBytes, r.GPUCount = max(0, r.CPUMillis), max(0, r.MemoryBytes), max(0, r.GPUCount)
	return r
}

// reject records on c why its node cannot take the Run, and returns false.
func reject(c *schemas.Candidate, code schemas.Code, format string, args ...any) bool {
	c.Reason, c.Detail = code, fmt.Sprintf(format, args...)
	return false
}

// admits reports whether the node may be booked at all: ready, leased, and
// with facts fresh enough to trust.
func (q *query) admits(rec *schemas.NodeRecord, c *schemas.Candidate) bool {
	switch {
	case rec.State == schemas.NodeDraining:
		return reject(c, schemas.ReasonNodeDraining, "node is draining")
	case rec.State != schemas.NodeReady:
		return reject(c, schemas.ReasonNodeNotReady, "node is %s", rec.State)
	case !q.now.Before(rec.LeaseExpires):
		return reject(c, schemas.ReasonLeaseStale, "no heartbeat since the lease expired at %s", rec.LeaseExpires.UTC().Format(time.RFC3339))
	case rec.Facts == nil || q.now.Sub(rec.FactsReceivedAt) > q.cfg.FactsMaxAge:
		return reject(c, schemas.ReasonFactsStale, "facts are older than %s", q.cfg.FactsMaxAge)
	case rec.Interruption != nil:
		return reject(c, schemas.ReasonNodeInterrupting, "node reported that its provider is taking it back (%s notice)", rec.Interruption.Source)
	case rec.Interruptible && !q.req.Spot.AllowsSpot():
		return reject(c, schemas.ReasonSpotNotAllowed, "node is interruptible (spot); the Run's spot policy is never: set spot to allowed to use it")
	case !rec.Interruptible && !q.req.Spot.AllowsOnDemand():
		return reject(c, schemas.ReasonOnDemandNotAllowed, "node is on-demand; the Run's spot policy is only")
	}
	return true
}

// supports reports whether the node runs this kind of Run: its platform,
// its network mode, and the cache mounts and artifact replicas it uses.
func (q *query) supports(n *Node, host *schemas.HostFacts, c *schemas.Candidate) bool {
	req := &q.req
	if q.needsPlatform && !runsOn(host, q.platform) {
		return reject(c, schemas.ReasonPlatformMismatch, "needs %s, node is %s", q.platform.String(), hostPlatform(host).String())
	}
	if mode := q.network; len(host.NetworkModes) > 0 && !slices.Contains(host.NetworkModes, mode) {
		return reject(c, schemas.ReasonNetworkUnavailable, "field network: needs %s; node offers %s%s", mode, strings.Join(host.NetworkModes, ", "), networkHint(mode))
	}
	if len(req.Run.Caches) > 0 && !n.support.CacheMounts {
		return reject(c, schemas.ReasonCacheMountsUnsupported, "mounts %d cache(s); node's runtime %q declares no cache mounts", len(req.Run.Caches), n.support.ContainerRuntime)
	}
	if len(req.Artifacts) > 0 && !n.support.ArtifactReplicas {
		return reject(c, schemas.ReasonArtifactsUnsupported, "mounts %d artifact(s); node's agent declares no artifact replica store", len(req.Artifacts))
	}
	return true
}

// cards checks the node's GPUs against the Run's: the driver, enough
// matching cards, enough of them usable. It returns how many matching
// cards are usable, held or not (0 when the Run needs none).
func (q *query) cards(n *Node, host *schemas.HostFacts, c *schemas.Candidate) (usable int64, ok bool) {
	want, need := q.req.Run.GPU, q.req.Run.Resources.GPUCount
	if need <= 0 {
		return 0, true
	}
	acc := &host.Accelerator
	if want != nil && want.MinDriverCapability != "" {
		switch {
		case acc.Vendor == "":
			return 0, reject(c, schemas.ReasonDriverMissing, "needs driver capability %s; node has no accelerator driver", want.MinDriverCapability)
		case versionLess(acc.DriverCapability, want.MinDriverCapability):
			return 0, reject(c, schemas.ReasonDriverTooOld, "needs driver capability %s, node has %s", want.MinDriverCapability, acc.DriverCapability)
		}
	}
	if matching := q.gpuMatches(n); matching < need {
		if want != nil && (want.Model != "" || want.MinMemoryBytes > 0) && acc.GPUCount() >= need {
			return 0, reject(c, schemas.ReasonGPUModelMismatch, "needs %d × %s; node has %s", need, gpuWant(want), describeGPUs(*acc))
		}
		return 0, reject(c, schemas.ReasonInsufficientGPU, "needs %d GPUs; node has %d", need, matching)
	}
	usable = q.usableCards(n)
	if usable < need {
		return 0, reject(c, schemas.ReasonGPUNotInjectable, "needs %d GPUs it can hand a container; %d of the node's matching cards have a CDI device and are healthy (see the node's facts)", need, usable)
	}
	return usable, true
}

// fitsEver reports whether the node has the disk the Run asks for now and
// the CPU, memory and GPUs it could ever give.
func (q *query) fitsEver(rec *schemas.NodeRecord, host *schemas.HostFacts, c *schemas.Candidate) bool {
	need := &q.req.Run.Resources
	if need.DiskBytes > 0 {
		switch {
		case !host.Disk.Known:
			return reject(c, schemas.ReasonDiskUnknown, "needs %d free bytes; node could not measure its disk", need.DiskBytes)
		case host.Disk.FreeBytes < need.DiskBytes:
			return reject(c, schemas.ReasonInsufficientDisk, "needs %d free bytes, node has %d", need.DiskBytes, host.Disk.FreeBytes)
		}
	}
	switch {
	case need.CPUMillis > rec.Capacity.CPUMillis:
		return reject(c, schemas.ReasonInsufficientCPU, "needs %dm CPU, node offers %dm", need.CPUMillis, rec.Capacity.CPUMillis)
	case need.MemoryBytes > rec.Capacity.MemoryBytes:
		return reject(c, schemas.ReasonInsufficientMemory, "needs %d bytes of memory, node offers %d", need.MemoryBytes, rec.Capacity.MemoryBytes)
	case need.GPUCount > rec.Capacity.GPUCount:
		return reject(c, schemas.ReasonInsufficientGPU, "needs %d GPUs, node offers %d", need.GPUCount, rec.Capacity.GPUCount)
	}
	return true
}

// fetchesFirst reports whether the Run, priced into c, would be booked on n
// to fetch its bytes first: n prepares ahead (NodeSupport.Prewarm) and
// lacks some of its image or artifacts. It claims its cards only once they
// are there.
func fetchesFirst(n *Node, c *schemas.Candidate) bool {
	return n.support.Prewarm && c.Components.FetchesBytes()
}

// fetches prices what node i lacks of the Run into c's components (image
// layers, caches, artifacts: fetch bytes of which the node holds warm)
// and returns the seconds fetching them takes.
func (q *query) fetches(i int, n *Node, c *schemas.Candidate, fetch int64, warm int) float64 {
	cfg, ref := &q.cfg, &q.ref
	comp := &c.Components
	hot := q.hot.has(i)
	if q.named != "" && q.named != n.build {
		hot = q.hotAs.has(i)
	}
	switch {
	case hot:
		comp.ImageState = string(schemas.LocalityHot)
	case q.refKnown:
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
	fetching := comp.PullSeconds + comp.CacheSeconds + comp.ArtifactSeconds
	if comp.FetchesBytes() {
		comp.LinkBusySeconds = n.linkBusy(q.now)
	}
	return fetching + comp.LinkBusySeconds
}

// score prices the node for the Run into c: seconds until the workload
// could start (the longer of its queue and its fetches: a queued booking
// fetches while it waits), the node's price, and its cards idle while its
// bytes arrive beyond the queue (held, or kept free for it when it fetches
// first: either way no other Run uses them).
func (q *query) score(n *Node, c *schemas.Candidate, queue, fetching float64, first bool) {
	cfg := &q.cfg
	comp := &c.Components
	comp.QueueSeconds, comp.PricePerHour = queue, n.Record.PricePerHour
	comp.StartSeconds = max(comp.QueueSeconds, fetching)
	comp.IdleGPUSeconds = q.idleRate * max(0, fetching-comp.QueueSeconds)
	c.Eligible, c.Cost = true, comp.StartSeconds+comp.IdleGPUSeconds+comp.DisplaceSeconds+cfg.SecondsPerDollarHour*comp.PricePerHour
	if comp.DisplaceSeconds > 0 {
		c.Detail = joinDetail(c.Detail, fmt.Sprintf("takes cards a booking fetching its bytes here counts on (+%.0fs: it would wait about that long)", comp.DisplaceSeconds))
	}
	if first {
		c.Detail = joinDetail(c.Detail, fmt.Sprintf("fetches its bytes first (about %.0fs), then takes its cards", fetching))
	}
	if len(q.req.Penalties) > 0 && cfg.FailedNodePenaltySeconds >= 0 {
		if why, ok := q.req.Penalties[c.NodeID]; ok {
			comp.PenaltySeconds = cfg.FailedNodePenaltySeconds
			c.Cost += comp.PenaltySeconds
			c.Detail = joinDetail(c.Detail, fmt.Sprintf("penalised: %s (+%.0fs)", why, comp.PenaltySeconds))
		}
	}
}

// idleGPURate is what one second of fetching on a node costs the Run in
// cost seconds beyond the second itself: its cards are booked, idle,
// while the bytes arrive. A GPU-hour at cfg's price is that many dollars,
// and a dollar is SecondsPerDollarHour seconds, as the node's price is
// weighed (a node $1/hour dearer, held an hour, costs a dollar more).
func idleGPURate(cfg *Config, gpus int64) float64 {
	price := cfg.GPUHourPrice
	if price == 0 {
		price = DefaultGPUHourPrice
	}
	if price < 0 || gpus <= 0 {
		return 0
	}
	return float64(gpus) * price / 3600 * cfg.SecondsPerDollarHour
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

// networkHint says what gives a node a network mode it lacks: host
// networking is off unless its agent was started allowing it.
func networkHint(mode string) string {
	if mode == string(schemas.NetworkHost) {
		return " (host networking needs an agent started with --allow-host-network)"
	}
	return ""
}
