package schemas

import "time"

// Disk items: what a node's disk collection may remove.
const (
	DiskItemImage = "image" // an image, by manifest (or index) digest
	DiskItemCache = "cache" // a cache directory, by name and compatibility key
	// DiskItemArtifact is an artifact replica, by sha256 digest.
	DiskItemArtifact = "artifact"
)

// DiskKeep is what the control plane says a node must keep because Runs
// booked or queued on it need it: asked for by the node on
// wf.node.<id>.disk.keep (DiskKeepRequest) when it is about to collect,
// and sent with each prune.
type DiskKeep struct {
	Items []DiskItem `json:"items,omitempty"`
}

// MaxKeepItems bounds a keep list: a node booked with more distinct
// images and caches than this is not a node any scheduler makes.
const MaxKeepItems = 4096

// Validate checks each item's kind and id.
func (k DiskKeep) Validate() error {
	if len(k.Items) > MaxKeepItems {
		return refuse(CodeTooManyItems, "items", "%d keep items; at most %d", len(k.Items), MaxKeepItems)
	}
	for _, it := range k.Items {
		if it.Kind != DiskItemImage && it.Kind != DiskItemCache && it.Kind != DiskItemArtifact {
			return refuse(CodeMalformed, "items.kind", "kind %q is not %q, %q or %q", it.Kind, DiskItemImage, DiskItemCache, DiskItemArtifact)
		}
		if it.ID == "" || len(it.ID) > 300 {
			return refuse(CodeMalformed, "items.id", "an item's id must be 1..300 bytes")
		}
	}
	return nil
}

// DiskKeepRequest is a node's question on wf.node.<id>.disk.keep, under its
// current session.
type DiskKeepRequest struct {
	NodeID       string `json:"node_id"`
	FencingToken uint64 `json:"fencing_token"`
}

// DiskItem is one image or cache on a node's disk, as a collection or a
// prune reports it. ID is the image's digest, or the cache's name and
// compatibility key joined by "/" (name alone for none). Reason says why
// it was (or would be) removed, or why it was kept.
type DiskItem struct {
	Kind       string    `json:"kind"`
	ID         string    `json:"id"`
	SizeBytes  int64     `json:"size_bytes,omitempty"`
	LastUsedAt time.Time `json:"last_used_at,omitzero"`
	Reason     string    `json:"reason,omitempty"`
}

// Validate checks the asker's identity fields.
func (r DiskKeepRequest) Validate() error {
	if err := ValidateID("node_id", r.NodeID, CodeMalformed); err != nil {
		return err
	}
	if r.FencingToken == 0 {
		return refuse(CodeStaleFencingToken, "fencing_token", "a node asks under the fencing token of its enrollment (≥ 1)")
	}
	return CheckNodeSizes("", &r)
}

// CacheItemID names a cache as a DiskItem does.
func CacheItemID(name, compatibilityKey string) string {
	if compatibilityKey == "" {
		return name
	}
	return name + "/" + compatibilityKey
}

// PruneRequest is an operator's request on wf.admin.node.prune: remove
// every image and cache on the node that nothing running or booked uses.
type PruneRequest struct {
	NodeID string `json:"node_id"`
	// DryRun lists what would be removed and removes nothing.
	DryRun bool `json:"dry_run,omitempty"`
}

// Validate checks the node id.
func (r PruneRequest) Validate() error {
	return ValidateID("node_id", r.NodeID, CodeMalformed)
}

// DiskPrune is the control plane's request to a node on
// wf.node.<id>.disk.prune, stamped with the node's session and carrying
// what booked Runs need kept.
type DiskPrune struct {
	NodeID       string   `json:"node_id"`
	FencingToken uint64   `json:"fencing_token"`
	DryRun       bool     `json:"dry_run,omitempty"`
	Keep         DiskKeep `json:"keep"`
}

// Validate checks the node, its session and the keep list.
func (p DiskPrune) Validate() error {
	if err := ValidateID("node_id", p.NodeID, CodeMalformed); err != nil {
		return err
	}
	if p.FencingToken == 0 {
		return refuse(CodeStaleFencingToken, "fencing_token", "a prune carries the fencing token of the node's enrollment (≥ 1)")
	}
	return p.Keep.Validate()
}

// PruneReport is a node's account of a prune (or of a dry run: what it
// would remove): each item removed with its size, each one kept and why,
// and the disk before and after.
type PruneReport struct {
	NodeID     string     `json:"node_id"`
	DryRun     bool       `json:"dry_run,omitempty"`
	Removed    []DiskItem `json:"removed,omitempty"`
	Kept       []DiskItem `json:"kept,omitempty"`
	Failed     []DiskItem `json:"failed,omitempty"`
	FreedBytes int64      `json:"freed_bytes"`
	Before     DiskFacts  `json:"disk_before"`
	After      DiskFacts  `json:"disk_after"`
}

// Validate checks a node's prune report: its node id and sizes.
func (r *PruneReport) Validate() error {
	if err := ValidateID("node_id", r.NodeID, CodeMalformed); err != nil {
		return err
	}
	return CheckNodeSizes("", r)
}
