package schemas

import (
	"crypto/sha256"
	"encoding/hex"
	"time"
)

// Prefetch limits.
const (
	// MaxPrefetchNodes bounds the nodes one prefetch record names, so the
	// record stays one KV value well inside NATS's message limit.
	MaxPrefetchNodes = 1000
	// MaxSelectorBytes bounds a node selector.
	MaxSelectorBytes = 4096
	// DefaultPrefetchTimeout is how long a prefetch's unfinished entries
	// stay live when the request names no timeout.
	DefaultPrefetchTimeout = time.Hour
	// MaxPrefetchTimeout bounds a request's timeout.
	MaxPrefetchTimeout = 24 * time.Hour
)

// PrefetchRequest is an operator's request (on wf.admin.prefetch) to warm
// an image, or an artifact from the catalog, on nodes before Runs need it.
// Exactly one of Image (pinned by digest) and Artifact (NAME, NAME:VERSION
// or NAME@sha256:<hex>; see ParseArtifactRef) is set. Nodes is a selector
// (see controlplane/prefetch.ParseSelector); Count, when set, takes the
// best that many matching live nodes that lack the content. Neither:
// every live node. The same RequestID always names the same prefetch.
type PrefetchRequest struct {
	Version        int    `json:"version,omitempty"`
	RequestID      string `json:"request_id"`
	Image          string `json:"image,omitempty"`
	Artifact       string `json:"artifact,omitempty"`
	Nodes          string `json:"nodes,omitempty"`
	Count          int    `json:"count,omitempty"`
	TimeoutSeconds int64  `json:"timeout_seconds,omitempty"`
	// Tenant is whose prefetch it is (empty: DefaultTenant): an image is
	// pulled with its registry credentials, an artifact must be its own or
	// shared.
	Tenant string `json:"tenant,omitempty"`
}

// TenantOf is the request's tenant, DefaultTenant when it names none.
func (r *PrefetchRequest) TenantOf() string {
	if r.Tenant == "" {
		return DefaultTenant
	}
	return r.Tenant
}

// Validate checks everything but the selector's syntax, which the control
// plane's parser owns; the error is always a *Refusal.
func (r *PrefetchRequest) Validate() error {
	if r.Version < 0 || r.Version > SchemaVersion {
		return refuse(CodeUnsupportedVersion, "version", "version %d is not supported", r.Version)
	}
	if err := ValidateID("request_id", r.RequestID, CodeInvalidRequestID); err != nil {
		return err
	}
	if r.Tenant != "" {
		if err := ValidateTenant("tenant", r.Tenant); err != nil {
			return err
		}
	}
	switch {
	case r.Image != "" && r.Artifact != "":
		return refuse(CodeMalformed, "artifact", "a prefetch warms an image or an artifact, not both; send one request for each")
	case r.Artifact != "":
		if _, err := ParseArtifactRef("artifact", r.Artifact); err != nil {
			return err
		}
	case r.Image == "":
		return refuse(CodeMissingField, "image", "name what to warm: an image pinned by digest (image) or a catalog artifact (artifact)")
	default:
		if _, err := ParseImageRef("image", r.Image); err != nil {
			return err
		}
	}
	if len(r.Nodes) > MaxSelectorBytes {
		return refuse(CodeValueTooLong, "nodes", "a node selector is at most %d bytes; name fewer nodes or use --count", MaxSelectorBytes)
	}
	if r.Count < 0 || r.Count > MaxPrefetchNodes {
		return refuse(CodeTooManyItems, "count", "must be between 0 (every matching node) and %d", MaxPrefetchNodes)
	}
	if r.TimeoutSeconds < 0 || r.TimeoutSeconds > int64(MaxPrefetchTimeout/time.Second) {
		return refuse(CodeMalformed, "timeout_seconds", "must be between 0 (default %s) and %d seconds", DefaultPrefetchTimeout, int64(MaxPrefetchTimeout/time.Second))
	}
	return nil
}

// Timeout is the request's timeout, or the default.
func (r *PrefetchRequest) Timeout() time.Duration {
	if r.TimeoutSeconds == 0 {
		return DefaultPrefetchTimeout
	}
	return time.Duration(r.TimeoutSeconds) * time.Second
}

// PrefetchIDFor derives a prefetch's id from its request id, so a request
// sent again names the same prefetch.
func PrefetchIDFor(requestID string) string {
	sum := sha256.Sum256([]byte(requestID))
	return "pf-" + hex.EncodeToString(sum[:12])
}

// PrefetchState is one node's part of a prefetch.
type PrefetchState string

const (
	PrefetchSent    PrefetchState = "sent"    // PrepareImage (or PrepareArtifact) is on its way
	PrefetchPulling PrefetchState = "pulling" // the node reports bytes moving
	PrefetchReady   PrefetchState = "ready"   // the node holds the image, unpacked, or a verified replica of the artifact
	PrefetchFailed  PrefetchState = "failed"  // the node could not prepare it (Reason says why)
	PrefetchSkipped PrefetchState = "skipped" // never sent (Reason says why)
)

// Finished says the node's entry will not change again.
func (s PrefetchState) Finished() bool {
	return s == PrefetchReady || s == PrefetchFailed || s == PrefetchSkipped
}

// Prefetch is a prefetch's record in wf_prefetch, keyed by its id, written
// only by the control plane, by CAS. The bucket's age limit removes it a
// while after its last change.
type Prefetch struct {
	ID        string `json:"id"`
	RequestID string `json:"request_id"`
	// Tenant is the request's (TenantOf); empty in a record stored before
	// tenants, which is DefaultTenant's.
	Tenant string `json:"tenant,omitempty"`
	// Image and ManifestDigest name an image prefetch's image; Artifact,
	// instead, the catalog's artifact an artifact prefetch fetches.
	Image          string            `json:"image,omitempty"`
	ManifestDigest string            `json:"manifest_digest,omitempty"`
	Artifact       *PrefetchArtifact `json:"artifact,omitempty"`
	Selector       string            `json:"selector,omitempty"`
	Count          int               `json:"count,omitempty"`
	// CreatedAt and ExpiresAt are the control plane's clock. Past
	// ExpiresAt an unfinished entry no longer counts (TimedOut).
	CreatedAt time.Time      `json:"created_at"`
	ExpiresAt time.Time      `json:"expires_at"`
	Nodes     []PrefetchNode `json:"nodes"`
}

// PrefetchArtifact is the artifact a prefetch fetches, as the catalog
// resolved it when the prefetch was made: nodes and their receipts are
// matched by Digest.
type PrefetchArtifact struct {
	Name      string         `json:"name"`
	Version   string         `json:"version"`
	Digest    string         `json:"digest"`
	SizeBytes int64          `json:"size_bytes"`
	Source    ArtifactSource `json:"source"`
}

// PrefetchArtifactOf is a resolved mount, without its path.
func PrefetchArtifactOf(m ArtifactMount) *PrefetchArtifact {
	return &PrefetchArtifact{Name: m.Name, Version: m.Version, Digest: m.Digest, SizeBytes: m.SizeBytes, Source: m.Source}
}

// Mount is the artifact as a mount without a path, as dispatch sends it.
func (a PrefetchArtifact) Mount() ArtifactMount {
	return ArtifactMount{Name: a.Name, Version: a.Version, Digest: a.Digest, SizeBytes: a.SizeBytes, Source: a.Source}
}

// Content names what the prefetch warms, for operators: the image, or the
// artifact's name, version and digest.
func (p *Prefetch) Content() string {
	if a := p.Artifact; a != nil {
		return "artifact " + a.Name + ":" + a.Version + "@" + a.Digest
	}
	return p.Image
}

// ContentDigest is the digest nodes report holding the content by: the
// image's manifest digest or the artifact's.
func (p *Prefetch) ContentDigest() string {
	if p.Artifact != nil {
		return p.Artifact.Digest
	}
	return p.ManifestDigest
}

// PrefetchNode is one node's entry in a prefetch.
type PrefetchNode struct {
	NodeID      string            `json:"node_id"`
	State       PrefetchState     `json:"state"`
	OperationID string            `json:"operation_id,omitempty"`
	Progress    *TransferProgress `json:"progress,omitempty"`
	Code        Code              `json:"code,omitempty"`
	Reason      string            `json:"reason,omitempty"`
	UpdatedAt   time.Time         `json:"updated_at"`
}

// Node returns the entry of a node, or nil.
func (p *Prefetch) Node(id string) *PrefetchNode {
	for i := range p.Nodes {
		if p.Nodes[i].NodeID == id {
			return &p.Nodes[i]
		}
	}
	return nil
}

// TimedOut says the prefetch is past its deadline.
func (p *Prefetch) TimedOut(now time.Time) bool { return !now.Before(p.ExpiresAt) }

// Finished says no entry will change again: every one is finished, or the
// prefetch timed out.
func (p *Prefetch) Finished(now time.Time) bool {
	if p.TimedOut(now) {
		return true
	}
	for _, n := range p.Nodes {
		if !n.State.Finished() {
			return false
		}
	}
	return true
}

// ImageProgress is a node's report of a prefetch's transfer under way (a
// Run's goes on its WorkloadObservation instead).
type ImageProgress struct {
	OperationID    string           `json:"operation_id"`
	PrefetchID     string           `json:"prefetch_id"`
	ManifestDigest string           `json:"manifest_digest,omitempty"`
	Progress       TransferProgress `json:"progress"`
	ObservedAt     time.Time        `json:"observed_at,omitzero"`
}

func (p *ImageProgress) validate() error {
	if err := ValidateID("image_progress.operation_id", p.OperationID, CodeMalformed); err != nil {
		return err
	}
	if err := ValidateID("image_progress.prefetch_id", p.PrefetchID, CodeMalformed); err != nil {
		return err
	}
	return p.Progress.Validate()
}

// TenantOf is the prefetch's tenant, DefaultTenant for a record stored
// before prefetches named one.
func (p Prefetch) TenantOf() string {
	if p.Tenant == "" {
		return DefaultTenant
	}
	return p.Tenant
}
