package schemas

import (
	"cmp"
	"regexp"
	"slices"
	"time"
)

// NodeFacts is what a node measured about itself. A measurement a node did
// not make is absent, never guessed: see the Established and Known flags.
type NodeFacts struct {
	ObservedAt time.Time       `json:"observed_at"`
	Host       HostFacts       `json:"host"`
	Images     []ImageLocality `json:"images,omitempty"`
	Caches     []CacheFact     `json:"caches,omitempty"`
	// Artifacts are the node's verified replicas; nil from a node that
	// keeps none (artifact.go).
	Artifacts *ArtifactInventory `json:"artifacts,omitempty"`
	// Support is what the node's agent and runtime can do; nil from an
	// agent that predates it (see Supports).
	Support *NodeSupport `json:"support,omitempty"`
}

// NodeSupport is what a node declares it can do, so the control plane reads
// the node's abilities instead of assuming one runtime.
type NodeSupport struct {
	// ContainerRuntime names the implementation (e.g. "containerd"); it is
	// provenance for operators, and no decision branches on it.
	ContainerRuntime string `json:"container_runtime"`
	// ExactImageInventory: the node lists the image and layer digests it
	// holds, so its image locality is exact; without it locality is an
	// estimate that placement does not count as warmth.
	ExactImageInventory bool `json:"exact_image_inventory"`
	// CacheMounts: the node keeps named caches across workloads and mounts
	// them into Runs.
	CacheMounts bool `json:"cache_mounts"`
	// Prewarm: the node accepts preparation work (a prepare-only image
	// command) for a workload it has not been asked to launch.
	Prewarm bool `json:"prewarm"`
	// GarbageCollection: the node reclaims disk on its own between
	// watermarks (DiskWatermarks), never taking what a running or booked
	// workload uses.
	GarbageCollection bool `json:"garbage_collection"`
	// DiskWatermarks are the used-disk percentages collection runs between,
	// when GarbageCollection holds.
	DiskWatermarks *DiskWatermarks `json:"disk_watermarks,omitempty"`
	// MaxConcurrentWorkloads is how many workloads may execute at once; 0
	// is no cap of the node's own. One makes the node a queue.
	MaxConcurrentWorkloads int `json:"max_concurrent_workloads,omitempty"`
	// ArtifactReplicas: the node fetches artifacts into a verified replica
	// store (PrepareArtifact) and mounts them read-only into workloads.
	ArtifactReplicas bool `json:"artifact_replicas,omitempty"`
}

// DiskWatermarks bound a node's disk collection: past High percent used
// the node removes what it may, least recently used first, until it is at
// or below Low percent.
type DiskWatermarks struct {
	High int `json:"high_percent"`
	Low  int `json:"low_percent"`
}

// Validate refuses watermarks outside 1..99 or a low one not below the
// high one.
func (w DiskWatermarks) Validate() error {
	switch {
	case w.High < 1 || w.High > 99:
		return refuse(CodeMalformed, "high_percent", "disk high watermark %d%% is outside 1..99; give a percent of the content disk used", w.High)
	case w.Low < 1 || w.Low > 99:
		return refuse(CodeMalformed, "low_percent", "disk low watermark %d%% is outside 1..99; give a percent of the content disk used", w.Low)
	case w.Low >= w.High:
		return refuse(CodeMalformed, "low_percent", "disk low watermark %d%% must be below the high watermark %d%%", w.Low, w.High)
	}
	return nil
}

// legacySupport is what an agent that declares no NodeSupport has always
// done: the containerd agent before NodeSupport existed listed its images
// exactly, mounted caches and took prepare-only commands, and never
// collected disk. Like an empty NetworkModes, silence keeps the old
// behaviour rather than refusing work to a running fleet mid-upgrade.
var legacySupport = NodeSupport{ExactImageInventory: true, CacheMounts: true, Prewarm: true}

// Supports is what the node declared it can do, or, from an agent that
// declares nothing, what such agents always did (legacySupport).
func (f *NodeFacts) Supports() NodeSupport {
	if f == nil {
		return NodeSupport{}
	}
	if f.Support == nil {
		s := legacySupport
		s.ContainerRuntime = f.Host.ContainerRuntime
		return s
	}
	return *f.Support
}

// HostFacts describes the machine.
type HostFacts struct {
	OS            string `json:"os"`
	KernelVersion string `json:"kernel_version,omitempty"`
	Architecture  string `json:"architecture"`
	// Variant is the CPU variant where the runtime knows one (e.g. "v8"
	// on arm64, "v7" on arm), as containerd names this host's platform;
	// empty reads by OCI normalization (arm64 is v8, arm is v7).
	Variant          string `json:"variant,omitempty"`
	ContainerRuntime string `json:"container_runtime,omitempty"`
	RuntimeVersion   string `json:"runtime_version,omitempty"`
	// AcceleratorToolkit is what lets the container runtime hand a container
	// the cards (e.g. nvidia-container-toolkit), when present.
	AcceleratorToolkit string           `json:"accelerator_toolkit,omitempty"`
	Accelerator        AcceleratorFacts `json:"accelerator"`
	CPUMillis          int64            `json:"cpu_millis"`
	MemoryBytes        int64            `json:"memory_bytes"`
	Disk               DiskFacts        `json:"disk"`
	// NetworkModes are the network modes this node gives Runs (bridge,
	// host, none). Empty means the node did not say (an older agent); a
	// node that lists them takes no Run whose mode is missing.
	NetworkModes []string `json:"network_modes,omitempty"`
}

// AcceleratorFacts: Established says the node looked. A node that looked
// and found no driver states Established with no Vendor; a node whose probe
// failed states Established false, and the control plane then ignores the
// rest (see Normalize).
type AcceleratorFacts struct {
	Established      bool                `json:"established"`
	Vendor           string              `json:"vendor,omitempty"`
	DriverVersion    string              `json:"driver_version,omitempty"`
	DriverCapability string              `json:"driver_capability,omitempty"` // e.g. CUDA "12.4"
	Devices          []AcceleratorDevice `json:"devices,omitempty"`
	// Cards names each card the driver lists, by index: the identity a
	// booking holds (UUID) and the CDI devices a workload is given it by.
	// Devices above groups the same readable cards without identities.
	Cards []GPUCard `json:"cards,omitempty"`
	// CDI is what the host's CDI spec directories offer. A card with no
	// CDIDevices has no CDI spec here: no container can be given it.
	CDI CDIFacts `json:"cdi,omitzero"`
}

// AcceleratorDevice is a group of identical cards, named without UUIDs so
// that facts compare across machines.
type AcceleratorDevice struct {
	Model       string `json:"model"`
	MemoryBytes int64  `json:"memory_bytes"`
	Count       int64  `json:"count"`
}

// GPUCard is one card by identity: what a booking holds.
type GPUCard struct {
	// Index is the driver's enumeration index (nvidia-smi's "GPU 0").
	Index int `json:"index"`
	// UUID is the card's stable identity, e.g. "GPU-8a3f…"; empty only for
	// a card the driver lists but cannot read, which is then unhealthy.
	UUID        string `json:"uuid"`
	Model       string `json:"model"`
	MemoryBytes int64  `json:"memory_bytes"`
	// Health is "ok" or says why the card should take no new work (e.g.
	// "remapped rows pending: the card needs a reset; XID 79 critical
	// error").
	Health string `json:"health,omitempty"`
	// CDIDevices are the CDI device names (kind=name) that hand this card
	// to a container, the UUID's first (e.g. "nvidia.com/gpu=GPU-8a3f…",
	// then "nvidia.com/gpu=0"); none means the agent cannot inject it.
	CDIDevices []string `json:"cdi_devices,omitempty"`
	// MIGMode is the card's Multi-Instance GPU mode now; empty when the
	// card has no MIG. A MIG-enabled card is handed out by its instances
	// (MIGDevices), never whole.
	MIGMode MIGMode `json:"mig_mode,omitempty"`
	// MIGDevices are the MIG instances carved out of the card when MIGMode
	// is enabled.
	MIGDevices []MIGDevice `json:"mig_devices,omitempty"`
}

// GPUHealthOK is the health of a card that may take work.
const GPUHealthOK = "ok"

// Healthy says the card may take work (an empty Health, from a report
// that names none, counts as healthy, as placement reads it).
func (c GPUCard) Healthy() bool { return c.Health == "" || c.Health == GPUHealthOK }

// Injectable says a container can be given the whole card: it is healthy,
// has a UUID to book it by, is not split into MIG instances, and the host's
// CDI specs name it. A GPU host whose cards are not injectable takes no GPU
// Run.
func (c GPUCard) Injectable() bool {
	return c.Healthy() && c.UUID != "" && c.MIGMode != MIGEnabled && len(c.CDIDevices) > 0
}

// CDIDevicesFor returns the CDI device of each card named by uuids, in
// order; ok is false when a card is unknown or has none.
func (a AcceleratorFacts) CDIDevicesFor(uuids []string) (devices []string, ok bool) {
	for _, u := range uuids {
		i := slices.IndexFunc(a.Cards, func(c GPUCard) bool { return c.UUID == u })
		if i < 0 || len(a.Cards[i].CDIDevices) == 0 {
			return nil, false
		}
		devices = append(devices, a.Cards[i].CDIDevices[0])
	}
	return devices, true
}

// MIGMode is a card's Multi-Instance GPU mode as the driver reports it now
// (a pending change takes effect at the next reset). Empty: no MIG.
type MIGMode string

// MIG modes.
const (
	MIGDisabled MIGMode = "disabled"
	MIGEnabled  MIGMode = "enabled"
)

// MIGDevice is one MIG instance (a GPU instance with one compute instance).
type MIGDevice struct {
	// Index is the driver's MIG device index within its card.
	Index             int    `json:"index"`
	UUID              string `json:"uuid,omitempty"`    // "MIG-…"
	Profile           string `json:"profile,omitempty"` // e.g. "1g.5gb", "1c.2g.10gb"
	MemoryBytes       int64  `json:"memory_bytes,omitempty"`
	GPUInstanceID     int    `json:"gpu_instance_id"`
	ComputeInstanceID int    `json:"compute_instance_id"`
	// CDIDevices are the CDI names offered for this instance, the UUID's
	// first (e.g. "nvidia.com/gpu=MIG-…", then "nvidia.com/gpu=0:1").
	CDIDevices []string `json:"cdi_devices,omitempty"`
}

// CDIFacts describes the host's Container Device Interface specs: what the
// node's runtime can hand a container.
type CDIFacts struct {
	// Scanned says the node read its spec directories (a directory that
	// does not exist reads as empty).
	Scanned bool `json:"scanned"`
	// SpecDirs are the directories read, lowest priority first.
	SpecDirs []string `json:"spec_dirs,omitempty"`
	// Devices is every fully qualified device name the valid specs
	// declare, sorted.
	Devices []string `json:"devices,omitempty"`
	// Errors are the spec files (or directories) that could not be used,
	// each with a short reason; the rest still count.
	Errors []CDISpecError `json:"errors,omitempty"`
}

// CDISpecError is a spec file or directory the node could not use.
type CDISpecError struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// GroupCards counts identical readable cards into Devices' form, sorted by
// model then memory, so two hosts holding the same cards state the same
// list. A card without a UUID (one the driver could not read) is not
// counted: leaving it out undercounts, never overcounts.
func GroupCards(cards []GPUCard) []AcceleratorDevice {
	type key struct {
		model  string
		memory int64
	}
	counts := map[key]int64{}
	for _, c := range cards {
		if c.UUID != "" {
			counts[key{c.Model, c.MemoryBytes}]++
		}
	}
	if len(counts) == 0 {
		return nil
	}
	out := make([]AcceleratorDevice, 0, len(counts))
	for k, n := range counts {
		out = append(out, AcceleratorDevice{Model: k.model, MemoryBytes: k.memory, Count: n})
	}
	slices.SortFunc(out, func(a, b AcceleratorDevice) int {
		return cmp.Or(cmp.Compare(a.Model, b.Model), cmp.Compare(a.MemoryBytes, b.MemoryBytes))
	})
	return out
}

// GPUCount is how many cards the facts establish.
func (a AcceleratorFacts) GPUCount() int64 {
	if !a.Established {
		return 0
	}
	var n int64
	for _, d := range a.Devices {
		n += d.Count
	}
	return n
}

// DiskFacts describes the filesystem holding the runtime's content.
type DiskFacts struct {
	Known      bool  `json:"known"`
	TotalBytes int64 `json:"total_bytes,omitempty"`
	FreeBytes  int64 `json:"free_bytes,omitempty"`
}

// Platform is one build of a multi-platform image.
type Platform struct {
	OS           string `json:"os"`
	Architecture string `json:"architecture"`
	Variant      string `json:"variant,omitempty"`
}

// platformPattern is one lowercase word, as OCI spells os, architecture
// and variant ("linux", "arm64", "v8").
var platformPattern = regexp.MustCompile(`^[a-z0-9_]{1,32}$`)

// String is os/architecture[/variant], the form operators write.
func (p Platform) String() string {
	s := p.OS + "/" + p.Architecture
	if p.Variant != "" {
		s += "/" + p.Variant
	}
	return s
}

// validate refuses a malformed platform named at field; nil is valid (the
// node's own). The value is not echoed: the field and its shape say enough.
func (p *Platform) validate(field string) error {
	if p == nil {
		return nil
	}
	if !platformPattern.MatchString(p.OS) || !platformPattern.MatchString(p.Architecture) || (p.Variant != "" && !platformPattern.MatchString(p.Variant)) {
		return refuse(CodeInvalidPlatform, field, "give os and architecture and an optional variant, each a lowercase word (e.g. linux/arm64/v8), or omit %s", field)
	}
	return nil
}

// LocalityState says how ready an image is on a node.
type LocalityState string

const (
	LocalityHot     LocalityState = "hot"     // every layer unpacked: a container can start now
	LocalityPartial LocalityState = "partial" // some content or layers are here
	LocalityCold    LocalityState = "cold"    // known to the node, nothing usable here
	LocalityUnknown LocalityState = "unknown" // the node could not verify
)

// ImageLocality is one image a node holds, by the digest it was pulled by.
type ImageLocality struct {
	// ManifestDigest is the digest the image was pulled by (an index digest
	// for a multi-platform image), the identity a Run is pinned to.
	ManifestDigest string `json:"manifest_digest"`
	// Platform is the build of that digest this node holds: for an index,
	// the one platform it fetched, which need not be the host's own.
	Platform Platform `json:"platform"`
	// Index says ManifestDigest names a multi-platform index, so Platform
	// is a fact about this node's copy, not about the image.
	Index bool `json:"index,omitempty"`
	// LayerDigests are the compressed layer blobs (registry names) and
	// LayerSizes their sizes, in the same order.
	LayerDigests []string `json:"layer_digests,omitempty"`
	LayerSizes   []int64  `json:"layer_sizes,omitempty"`
	// LayerDiffIDs name the unpacked chain by uncompressed digest.
	LayerDiffIDs []string `json:"layer_diff_ids,omitempty"`
	// ContentPresent: every byte is here, unpacked or not.
	ContentPresent bool          `json:"content_present"`
	State          LocalityState `json:"state"`
	LastVerifiedAt time.Time     `json:"last_verified_at"`
}

// CacheFact is a named cache directory a node holds for cache mounts.
type CacheFact struct {
	Name             string    `json:"name"`
	CompatibilityKey string    `json:"compatibility_key,omitempty"`
	SizeBytes        int64     `json:"size_bytes"`
	LastUsedAt       time.Time `json:"last_used_at,omitzero"`
}

// Normalize applies the Established rule where a report enters the control
// plane: measurements the node says it did not make are erased, so no
// decision rests on them.
func (f *NodeFacts) Normalize() {
	a := &f.Host.Accelerator
	if !a.Established {
		*a = AcceleratorFacts{}
	}
	if a.Vendor == "" {
		// Looked and found no driver: no driver, no cards. CDI specs may
		// still be on the host and are kept.
		a.DriverVersion, a.DriverCapability, a.Devices, a.Cards = "", "", nil, nil
	}
	if !a.CDI.Scanned {
		// Unscanned specs name nothing, for the host or for a card.
		a.CDI = CDIFacts{}
		for i := range a.Cards {
			a.Cards[i].CDIDevices = nil
			for j := range a.Cards[i].MIGDevices {
				a.Cards[i].MIGDevices[j].CDIDevices = nil
			}
		}
	}
	if !f.Host.Disk.Known {
		f.Host.Disk = DiskFacts{}
	}
	if f.Artifacts != nil {
		f.Artifacts.normalize()
	}
	for i := range f.Images {
		im := &f.Images[i]
		if im.State == "" {
			im.State = LocalityUnknown
		}
		if len(im.LayerSizes) != len(im.LayerDigests) {
			im.LayerSizes = nil
		}
	}
}
