package schemas

import (
	"encoding/base64"
	"encoding/hex"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Artifacts are immutable content (model weights, datasets) named in the
// control plane's catalog and held by nodes as verified replicas.

// Limits on artifacts.
const (
	// MaxArtifacts bounds the artifacts one Run mounts.
	MaxArtifacts = 16
	// MaxArtifactBytes bounds one artifact's size (4 TiB).
	MaxArtifactBytes = 4 << 40
	// MaxFactArtifacts bounds the replicas one facts report lists.
	MaxFactArtifacts = 4096
)

var (
	artifactNamePattern    = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	artifactVersionPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	sha256Pattern          = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	objectNamePattern      = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/:=-]{0,254}$`)
)

// ArtifactUse is a RunRequest's ask for an artifact, mounted read-only at
// Path. Version or Digest pins it; with neither the catalog's newest
// version is used, resolved once at intake.
type ArtifactUse struct {
	Name    string `json:"name"`
	Version string `json:"version,omitempty"`
	Digest  string `json:"digest,omitempty"`
	Path    string `json:"path"`
}

// ArtifactSource is where an artifact's bytes can be fetched: an object in
// the control plane's artifact object store bucket, or an HTTP(S) URL.
// Exactly one is set. A URL never carries a credential (userinfo or
// query); the control plane hands those over per fetch.
type ArtifactSource struct {
	Object string `json:"object,omitempty"`
	URL    string `json:"url,omitempty"`
}

// ArtifactRecord is one catalog entry in wf_artifacts, keyed by
// ArtifactKey(Name, Version). Tenant owns it: only that tenant's Runs and
// prefetches may use it, unless it is Shared, which lets every tenant's.
type ArtifactRecord struct {
	Name      string         `json:"name"`
	Version   string         `json:"version"`
	Digest    string         `json:"digest"`
	SizeBytes int64          `json:"size_bytes"`
	Source    ArtifactSource `json:"source"`
	CreatedAt time.Time      `json:"created_at"`
	// Tenant is empty in a record stored before tenants: DefaultTenant
	// (TenantOf).
	Tenant string `json:"tenant,omitempty"`
	Shared bool   `json:"shared,omitempty"`
}

// TenantOf is the record's tenant, DefaultTenant for a record stored
// before records named one.
func (r ArtifactRecord) TenantOf() string {
	if r.Tenant == "" {
		return DefaultTenant
	}
	return r.Tenant
}

// VisibleTo says whether tenant's Runs and prefetches may use the record:
// it is the tenant's own, or shared.
func (r ArtifactRecord) VisibleTo(tenant string) bool { return r.Shared || r.TenantOf() == tenant }

// ArtifactMount is an artifact resolved for one Run: the catalog's answer
// to an ArtifactUse. It is stored on the Run and sent in LaunchWorkload.
type ArtifactMount struct {
	Name      string         `json:"name"`
	Version   string         `json:"version"`
	Digest    string         `json:"digest"`
	SizeBytes int64          `json:"size_bytes"`
	Source    ArtifactSource `json:"source"`
	Path      string         `json:"path"`
}

// PrepareArtifact asks a node to hold a verified replica of an artifact.
type PrepareArtifact struct {
	RunID      string `json:"run_id,omitempty"`
	PrefetchID string `json:"prefetch_id,omitempty"`
	AttemptID  string `json:"attempt_id,omitempty"`
	// Name is provenance for logs; the replica is named by Digest.
	Name      string         `json:"name,omitempty"`
	Digest    string         `json:"digest"`
	SizeBytes int64          `json:"size_bytes"`
	Source    ArtifactSource `json:"source"`
}

// ArtifactInventory is a node's account of its replicas. A node that did
// not enumerate (Enumerated false) says nothing about what it holds:
// placement prices the fetch, it does not refuse the node.
type ArtifactInventory struct {
	Enumerated bool              `json:"enumerated"`
	Replicas   []ArtifactReplica `json:"replicas,omitempty"`
}

// ArtifactReplica is one verified artifact on a node's disk.
type ArtifactReplica struct {
	Digest     string    `json:"digest"`
	SizeBytes  int64     `json:"size_bytes"`
	VerifiedAt time.Time `json:"verified_at"`
	LastUsedAt time.Time `json:"last_used_at,omitzero"`
}

// ArtifactKey is the wf_artifacts key of a name and version.
func ArtifactKey(name, version string) string { return name + "/" + version }

// ValidArtifactName reports whether name is a catalog name.
func ValidArtifactName(name string) bool { return artifactNamePattern.MatchString(name) }

// ValidateArtifactName refuses a name that is not a catalog name.
func ValidateArtifactName(field, name string) error {
	if !artifactNamePattern.MatchString(name) {
		return refuse(CodeInvalidArtifact, field, "lowercase [a-z0-9._-], 1-63 characters, starting with a letter or digit")
	}
	return nil
}

// ValidateArtifactVersion refuses a version that is not a catalog version.
func ValidateArtifactVersion(field, version string) error {
	if !artifactVersionPattern.MatchString(version) {
		return refuse(CodeInvalidArtifact, field, "[A-Za-z0-9._-], 1-64 characters, starting with a letter or digit")
	}
	return nil
}

// ValidateSHA256 refuses anything but sha256:<64 lowercase hex>.
func ValidateSHA256(field, digest string) error {
	if !sha256Pattern.MatchString(digest) {
		return refuse(CodeInvalidDigest, field, "must be sha256:<64 lowercase hex digits>")
	}
	return nil
}

// ObjectStoreDigest converts sha256:<hex> into the NATS object store's
// form, SHA-256=<base64url>; "" when digest is not a sha256 digest.
func ObjectStoreDigest(digest string) string {
	if !sha256Pattern.MatchString(digest) {
		return ""
	}
	b, _ := hex.DecodeString(strings.TrimPrefix(digest, "sha256:"))
	return "SHA-256=" + base64.URLEncoding.EncodeToString(b)
}

// Validate refuses a source that is not exactly one well-formed object name
// or credential-free http(s) URL.
func (s ArtifactSource) Validate(field string) error {
	switch {
	case (s.Object == "") == (s.URL == ""):
		return refuse(CodeInvalidArtifact, field, "set exactly one of object and url")
	case s.Object != "":
		if !objectNamePattern.MatchString(s.Object) {
			return refuse(CodeInvalidArtifact, field+".object", "1-255 characters of [A-Za-z0-9._/:=-]")
		}
		return nil
	}
	u, err := url.Parse(s.URL)
	switch {
	case err != nil || len(s.URL) > 2048 || !cleanText(s.URL):
		return refuse(CodeInvalidArtifact, field+".url", "not a URL of at most 2048 bytes")
	case u.Scheme != "http" && u.Scheme != "https":
		return refuse(CodeInvalidArtifact, field+".url", "scheme must be http or https")
	case u.Host == "":
		return refuse(CodeInvalidArtifact, field+".url", "needs a host")
	case u.User != nil:
		return refuse(CodeInvalidArtifact, field+".url", "must not carry userinfo; give the credential to the control plane (serve --artifact-source-auth)")
	case u.RawQuery != "" || u.Fragment != "":
		return refuse(CodeInvalidArtifact, field+".url", "must not carry a query or fragment: a presigned query is a credential; give it to the control plane (serve --artifact-source-auth)")
	}
	return nil
}

// Validate checks a catalog record.
func (r *ArtifactRecord) Validate() error {
	if r.Tenant != "" {
		if err := ValidateTenant("tenant", r.Tenant); err != nil {
			return err
		}
	}
	if err := ValidateArtifactName("name", r.Name); err != nil {
		return err
	}
	if err := ValidateArtifactVersion("version", r.Version); err != nil {
		return err
	}
	return validateContent("", r.Digest, r.SizeBytes, r.Source)
}

// Validate checks a resolved mount.
func (m *ArtifactMount) Validate(field string) error {
	if err := ValidateArtifactName(field+".name", m.Name); err != nil {
		return err
	}
	if err := validateMountPath(field+".path", m.Path, CodeInvalidArtifact); err != nil {
		return err
	}
	return validateContent(field+".", m.Digest, m.SizeBytes, m.Source)
}

// Validate checks a PrepareArtifact payload.
func (p *PrepareArtifact) Validate() error {
	for _, id := range []struct{ field, v string }{{"prepare_artifact.run_id", p.RunID}, {"prepare_artifact.prefetch_id", p.PrefetchID}, {"prepare_artifact.attempt_id", p.AttemptID}} {
		if id.v != "" {
			if err := ValidateID(id.field, id.v, CodeMalformed); err != nil {
				return err
			}
		}
	}
	if p.Name != "" {
		if err := ValidateArtifactName("prepare_artifact.name", p.Name); err != nil {
			return err
		}
	}
	return validateContent("prepare_artifact.", p.Digest, p.SizeBytes, p.Source)
}

func validateContent(prefix, digest string, size int64, src ArtifactSource) error {
	if err := ValidateSHA256(prefix+"digest", digest); err != nil {
		return err
	}
	if size < 0 || size > MaxArtifactBytes {
		return refuse(CodeInvalidArtifact, prefix+"size_bytes", "must be between 0 and %d", int64(MaxArtifactBytes))
	}
	return src.Validate(prefix + "source")
}

// validateMountPath is the rule for where a cache or artifact is mounted.
func validateMountPath(field, path string, code Code) error {
	if !strings.HasPrefix(path, "/") || strings.Contains(path, "..") || len(path) > 1024 || path == "/" || !cleanText(path) {
		return refuse(code, field, "an absolute path inside the container, without ..")
	}
	return nil
}

// validateArtifacts checks a RunRequest's artifact uses; seen holds the
// paths the Run's caches already took.
func (r *RunRequest) validateArtifacts(seen map[string]bool) error {
	if len(r.Artifacts) > MaxArtifacts {
		return refuse(CodeTooManyItems, "artifacts", "at most %d artifacts", MaxArtifacts)
	}
	for i, a := range r.Artifacts {
		field := "artifacts[" + strconv.Itoa(i) + "]"
		if err := ValidateArtifactName(field+".name", a.Name); err != nil {
			return err
		}
		if a.Version != "" && a.Digest != "" {
			return refuse(CodeInvalidArtifact, field, "pin by version or by digest, not both")
		}
		if a.Version != "" {
			if err := ValidateArtifactVersion(field+".version", a.Version); err != nil {
				return err
			}
		}
		if a.Digest != "" {
			if err := ValidateSHA256(field+".digest", a.Digest); err != nil {
				return err
			}
		}
		if err := validateMountPath(field+".path", a.Path, CodeInvalidArtifact); err != nil {
			return err
		}
		if seen[a.Path] {
			return refuse(CodeInvalidArtifact, field+".path", "another cache or artifact is mounted at this path")
		}
		seen[a.Path] = true
	}
	return nil
}

// normalize keeps only replicas a decision may rest on: none from a node
// that did not enumerate, none with a malformed digest or size, at most
// MaxFactArtifacts.
func (inv *ArtifactInventory) normalize() {
	if !inv.Enumerated {
		inv.Replicas = nil
		return
	}
	kept := inv.Replicas[:0]
	for _, r := range inv.Replicas {
		if sha256Pattern.MatchString(r.Digest) && r.SizeBytes >= 0 && r.SizeBytes <= MaxArtifactBytes && len(kept) < MaxFactArtifacts {
			kept = append(kept, r)
		}
	}
	inv.Replicas = kept
}

// ArtifactsOf returns what facts say the node holds, by digest, and
// whether the node enumerated at all.
func (f *NodeFacts) ArtifactsOf() (held map[string]ArtifactReplica, enumerated bool) {
	if f == nil || f.Artifacts == nil || !f.Artifacts.Enumerated {
		return nil, false
	}
	held = make(map[string]ArtifactReplica, len(f.Artifacts.Replicas))
	for _, r := range f.Artifacts.Replicas {
		held[r.Digest] = r
	}
	return held, true
}

// ArtifactRegistration asks the control plane (wf.admin.artifact.register)
// to add Record to the catalog. A record for an object is checked against
// the object's own digest and size; CreatedAt is the control plane's.
type ArtifactRegistration struct {
	Version int            `json:"version,omitempty"`
	Record  ArtifactRecord `json:"record"`
}

// Validate checks a registration's version and record.
func (r *ArtifactRegistration) Validate() error {
	if err := validVersion(r.Version); err != nil {
		return err
	}
	return r.Record.Validate()
}

// ArtifactRemoval asks the control plane (wf.admin.artifact.rm) to remove
// one version of an artifact from the catalog, and its object when no other
// version holds the same one.
type ArtifactRemoval struct {
	Version         int    `json:"version,omitempty"`
	Name            string `json:"name"`
	ArtifactVersion string `json:"artifact_version"`
}

// Validate checks a removal's version and the artifact it names.
func (r *ArtifactRemoval) Validate() error {
	if err := validVersion(r.Version); err != nil {
		return err
	}
	if err := ValidateArtifactName("name", r.Name); err != nil {
		return err
	}
	return ValidateArtifactVersion("artifact_version", r.ArtifactVersion)
}

// validVersion refuses a message version this control plane does not
// speak; 0 means this one.
func validVersion(v int) error {
	if v < 0 || v > SchemaVersion {
		return refuse(CodeUnsupportedVersion, "version", "version %d is not supported; this control plane speaks %d", v, SchemaVersion)
	}
	return nil
}

// ArtifactCredentialRequest is what an agent asks on
// wf.node.<id>.credentials.artifact (core request/reply) before each fetch
// of Digest. The control plane answers only the node's current session
// (FencingToken) and only for an artifact the node has a live booking or
// prefetch for.
type ArtifactCredentialRequest struct {
	Version      int    `json:"version,omitempty"`
	NodeID       string `json:"node_id"`
	FencingToken uint64 `json:"fencing_token"`
	Digest       string `json:"digest"`
	RunID        string `json:"run_id,omitempty"`
	PrefetchID   string `json:"prefetch_id,omitempty"`
	// Offset is the byte an object-store fetch resumes from: the consumer
	// the control plane creates for it starts at the chunk holding it.
	Offset int64 `json:"offset,omitempty"`
}

// Validate checks an ArtifactCredentialRequest.
func (r *ArtifactCredentialRequest) Validate() error {
	if r.Version < 0 || r.Version > SchemaVersion {
		return refuse(CodeUnsupportedVersion, "version", "version %d is not supported; this control plane speaks %d", r.Version, SchemaVersion)
	}
	if err := ValidateID("node_id", r.NodeID, CodeMissingField); err != nil {
		return err
	}
	if r.FencingToken == 0 {
		return refuse(CodeMissingField, "fencing_token", "the node's current fencing token is required")
	}
	if r.Offset < 0 {
		return refuse(CodeMalformed, "offset", "negative offset %d; a fetch resumes from byte 0 or past it", r.Offset)
	}
	for _, id := range []struct{ field, v string }{{"run_id", r.RunID}, {"prefetch_id", r.PrefetchID}} {
		if id.v != "" {
			if err := ValidateID(id.field, id.v, CodeMalformed); err != nil {
				return err
			}
		}
	}
	if err := ValidateSHA256("digest", r.Digest); err != nil {
		return err
	}
	return CheckNodeSizes("", r)
}

// ArtifactCredential answers an ArtifactCredentialRequest. It travels only
// by core request/reply and is held by the agent for one fetch. For an
// object-store source, Object is the pull consumer the control plane
// created for this fetch and the object's info, and Login a NATS login
// (user and one-time token) allowed to pull that consumer and nothing else,
// until Expires; for a URL, Headers are sent with the fetch. Neither
// Login nor Headers set: the source needs no credential.
type ArtifactCredential struct {
	Digest  string              `json:"digest"`
	Login   *ArtifactLogin      `json:"login,omitempty"`
	Object  *ArtifactObjectRead `json:"object,omitempty"`
	Headers map[string]string   `json:"headers,omitempty"`
}

// ArtifactObjectRead is one fetch's read of an object-store object: the
// ephemeral pull consumer of its chunks the control plane created (the
// login may not create one, nor read the object's meta), and the object's
// info. The consumer delivers chunk StartChunk, which begins at byte
// StartByte, and every chunk after it.
type ArtifactObjectRead struct {
	Consumer string `json:"consumer"`
	// Digest is the object's own record of its content, in the object
	// store's form (ObjectStoreDigest); the node refuses one that is not
	// the artifact's before reading a byte.
	Digest     string `json:"digest"`
	Size       uint64 `json:"size"`
	Chunks     uint32 `json:"chunks"`
	StartChunk uint32 `json:"start_chunk,omitempty"`
	StartByte  int64  `json:"start_byte,omitempty"`
}

// ArtifactLogin is a short-lived NATS login scoped to reading artifacts.
type ArtifactLogin struct {
	User    string    `json:"user"`
	Token   string    `json:"token"`
	Expires time.Time `json:"expires"`
}

// String names what the credential is, never its secret.
func (c ArtifactCredential) String() string {
	switch {
	case c.Login != nil:
		return "artifact login " + c.Login.User + " for " + c.Digest
	case len(c.Headers) > 0:
		return strconv.Itoa(len(c.Headers)) + " source header(s) for " + c.Digest
	}
	return "no credential for " + c.Digest
}

// GoString keeps %#v from printing the secret.
func (c ArtifactCredential) GoString() string {
	return "schemas.ArtifactCredential{" + c.String() + "}"
}
