package schemas

import (
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
}

// HostFacts describes the machine.
type HostFacts struct {
	OS               string `json:"os"`
	KernelVersion    string `json:"kernel_version,omitempty"`
	Architecture     string `json:"architecture"`
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
	// Cards lists every card by identity.
	Cards []GPUCard `json:"cards,omitempty"`
}

// GPUCard is one card by identity: what a booking holds.
type GPUCard struct {
	Index       int    `json:"index"`
	UUID        string `json:"uuid"`
	Model       string `json:"model"`
	MemoryBytes int64  `json:"memory_bytes"`
	// Health is "ok" or says why the card should take no new work.
	Health string `json:"health,omitempty"`
	// CDIDevices are the CDI device names (kind=name) that hand this card
	// to a container; none means the agent cannot inject it.
	CDIDevices []string `json:"cdi_devices,omitempty"`
}

// GPUHealthOK is the health of a card that may take work.
const GPUHealthOK = "ok"

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

// AcceleratorDevice is a group of identical cards, named without UUIDs so
// that facts compare across machines.
type AcceleratorDevice struct {
	Model       string `json:"model"`
	MemoryBytes int64  `json:"memory_bytes"`
	Count       int64  `json:"count"`
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
	ManifestDigest string   `json:"manifest_digest"`
	Platform       Platform `json:"platform"`
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
	if !f.Host.Disk.Known {
		f.Host.Disk = DiskFacts{}
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
