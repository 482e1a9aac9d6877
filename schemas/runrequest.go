package schemas

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/warmfleet/warmfleet/bus/codec"
)

// Limits on a RunRequest. They keep one request from dominating a stream
// message, a KV value or a node's memory.
const (
	MaxRunRequestBytes  = 64 << 10
	MaxCommandItems     = 256
	MaxEnvItems         = 256
	MaxLabelItems       = 64
	MaxStringBytes      = 4096
	MaxCPUMillis        = 1 << 20        // 1024 cores
	MaxMemoryBytes      = 16 << 40       // 16 TiB
	MaxGPUCount         = 64             //
	MaxRuntimeSeconds   = 30 * 24 * 3600 // 30 days
	DefaultGraceSeconds = 10
	MaxGraceSeconds     = 3600
)

// RunRequest is what a producer publishes on wf.runs.<tenant>.<identity>.submit.
type RunRequest struct {
	Version int `json:"version,omitempty"`
	// RequestID is the producer's idempotency key. It is the Nats-Msg-Id of
	// the submit, and the Run id is derived from it, so a request id names one
	// Run forever, not only within the stream's dedupe window.
	RequestID string `json:"request_id"`
	// Image is name@sha256:<hex>; a tag is never image identity.
	Image   string            `json:"image"`
	Command []string          `json:"command,omitempty"`
	Args    []string          `json:"args,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	// Resources are what the workload needs reserved on a node.
	Resources         Resources         `json:"resources"`
	MaxRuntimeSeconds int64             `json:"max_runtime_seconds,omitempty"`
	Labels            map[string]string `json:"labels,omitempty"`
	// Platform the workload needs; empty means the node's own.
	Platform *Platform `json:"platform,omitempty"`
	// GPU narrows which cards count toward resources.gpu_count.
	GPU *GPURequirement `json:"gpu,omitempty"`
	// Caches are named directories that outlive the Run on its node; a node
	// that already holds one is warmer for the next Run that asks for it.
	Caches []CacheMount `json:"caches,omitempty"`
	// Network is the Run's network: "bridge" (the default when empty),
	// "host" or "none" (container.go).
	Network string `json:"network,omitempty"`
	// ShmBytes sizes /dev/shm; 0 means half of resources.memory_bytes, or
	// 1 GiB without a memory limit.
	ShmBytes int64 `json:"shm_bytes,omitempty"`
	// Ulimits are process resource limits, e.g. {"name":"nofile",...}.
	Ulimits []Ulimit `json:"ulimits,omitempty"`
	// Artifacts are catalog artifacts mounted read-only (artifact.go); a
	// node that already holds one is warmer by its size.
	Artifacts []ArtifactUse `json:"artifacts,omitempty"`
	// SecretEnv and SecretFiles reference the tenant's secrets by name
	// (secretref.go): their values are fetched by the node at launch and
	// never stored with the Run.
	SecretEnv   []SecretEnvRef  `json:"secret_env,omitempty"`
	SecretFiles []SecretFileRef `json:"secret_files,omitempty"`
	// Priority names a priority class of the control plane's policy;
	// empty is the policy's default class (scheduling.go).
	Priority string `json:"priority,omitempty"`
	// Preemptible lets a higher class, or a tenant reclaiming lent
	// quota, stop this Run and requeue it.
	Preemptible bool `json:"preemptible,omitempty"`
	// Retry overrides the tenant's default retry policy.
	Retry *RetryPolicy `json:"retry,omitempty"`
	// Spot says whether rented interruptible capacity may take the Run
	// (spot.go); empty is the tenant's policy, else never.
	Spot SpotPolicy `json:"spot,omitempty"`
	// Ephemeral lets the Run execute on the ephemeral lane (lane.go) when
	// that starts it sooner than any node or rental.
	Ephemeral bool `json:"ephemeral,omitempty"`
	// StartDeadlineSeconds fails the Run deadline_exceeded when it has not
	// started running this long after it was accepted (0: no deadline).
	StartDeadlineSeconds int64 `json:"start_deadline_seconds,omitempty"`
	// GraceSeconds is how long the Run is given to stop when the control
	// plane stops it (preemption, deadline, budget) before it is killed;
	// 0 is DefaultGraceSeconds. A max-runtime stop uses the node's own
	// stop grace.
	GraceSeconds int64 `json:"grace_seconds,omitempty"`
}

// GPURequirement constrains the cards a Run gets.
type GPURequirement struct {
	// Model matches a device model case-insensitively by substring
	// ("H100" matches "NVIDIA H100 80GB HBM3").
	Model          string `json:"model,omitempty"`
	MinMemoryBytes int64  `json:"min_memory_bytes,omitempty"`
	// MinDriverCapability is the CUDA driver API version the image's
	// accelerator stack needs, e.g. "12.2".
	MinDriverCapability string `json:"min_driver_capability,omitempty"`
}

// CacheMount asks for a named cache directory mounted at Path. Runs that
// name the same cache with the same CompatibilityKey share its contents.
type CacheMount struct {
	Name             string `json:"name"`
	CompatibilityKey string `json:"compatibility_key,omitempty"`
	Path             string `json:"path"`
	ReadOnly         bool   `json:"read_only,omitempty"`
}

// Resources are the reservations a Run needs.
type Resources struct {
	CPUMillis   int64 `json:"cpu_millis,omitempty"`
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	GPUCount    int64 `json:"gpu_count,omitempty"`
	// DiskBytes is the free disk a node must have (a floor, not reserved).
	DiskBytes int64 `json:"disk_bytes,omitempty"`
}

// Fits reports whether r fits in free.
func (r Resources) Fits(free Resources) bool {
	return r.CPUMillis <= free.CPUMillis && r.MemoryBytes <= free.MemoryBytes && r.GPUCount <= free.GPUCount
}

// Sub returns r minus o. DiskBytes is a floor, not a reservation: it is
// kept from r.
func (r Resources) Sub(o Resources) Resources {
	return Resources{CPUMillis: r.CPUMillis - o.CPUMillis, MemoryBytes: r.MemoryBytes - o.MemoryBytes, GPUCount: r.GPUCount - o.GPUCount, DiskBytes: r.DiskBytes}
}

// Add returns r plus o (DiskBytes kept from r, as in Sub).
func (r Resources) Add(o Resources) Resources {
	return Resources{CPUMillis: r.CPUMillis + o.CPUMillis, MemoryBytes: r.MemoryBytes + o.MemoryBytes, GPUCount: r.GPUCount + o.GPUCount, DiskBytes: r.DiskBytes}
}

var (
	idPattern       = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)
	envNamePattern  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	labelKeyPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$`)
	repoPattern     = regexp.MustCompile(`^[a-z0-9]+(?:[._-]{1,2}[a-z0-9]+|[.:][0-9]+)*(?:/[a-z0-9]+(?:[._-]{1,2}[a-z0-9]+)*)*$`)
	hexPattern      = regexp.MustCompile(`^[a-f0-9]{64}$`)
	tagPattern      = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
)

// ImageRef is a parsed, digest-pinned image reference.
type ImageRef struct {
	Name   string // repository, e.g. "localhost/busybox"
	Digest string // "sha256:<64 hex>"
}

// String is the canonical name@digest form.
func (r ImageRef) String() string { return r.Name + "@" + r.Digest }

// ParseImageRef parses name[:tag]@sha256:<hex>. A reference without a digest
// is refused: a tag can move, and warmfleet pins a Run to bytes.
func ParseImageRef(field, s string) (ImageRef, error) {
	if s == "" {
		return ImageRef{}, refuse(CodeMissingField, field, "an image reference pinned by digest is required (name@sha256:<64 hex>)")
	}
	if len(s) > MaxStringBytes {
		return ImageRef{}, refuse(CodeValueTooLong, field, "image reference is longer than %d bytes", MaxStringBytes)
	}
	name, dgst, ok := strings.Cut(s, "@")
	if !ok {
		return ImageRef{}, refuse(CodeImageNotPinned, field, "image is not pinned by digest; resolve the tag and send name@sha256:<64 hex>")
	}
	algo, hx, ok := strings.Cut(dgst, ":")
	if !ok || algo != "sha256" || !hexPattern.MatchString(hx) {
		return ImageRef{}, refuse(CodeInvalidDigest, field, "digest must be sha256:<64 lowercase hex>")
	}
	// A tag beside the digest is allowed by the reference grammar and ignored
	// here: the digest decides.
	repo := name
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		repo = name[:i]
		if !tagPattern.MatchString(name[i+1:]) {
			return ImageRef{}, refuse(CodeInvalidImage, field, "a tag beside the digest must match [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
		}
	}
	if repo == "" || !repoPattern.MatchString(repo) {
		return ImageRef{}, refuse(CodeInvalidImage, field, "repository name must be lowercase [a-z0-9] components separated by / . _ -")
	}
	return ImageRef{Name: repo, Digest: dgst}, nil
}

// Validate checks every field and returns the first *Refusal.
func (r *RunRequest) Validate() error {
	if r.Version < 0 || r.Version > SchemaVersion {
		return refuse(CodeUnsupportedVersion, "version", "version %d is not supported; this control plane speaks %d", r.Version, SchemaVersion)
	}
	if err := ValidateID("request_id", r.RequestID, CodeInvalidRequestID); err != nil {
		return err
	}
	if _, err := ParseImageRef("image", r.Image); err != nil {
		return err
	}
	if err := validateStrings("command", r.Command); err != nil {
		return err
	}
	if err := validateStrings("args", r.Args); err != nil {
		return err
	}
	if len(r.Env) > MaxEnvItems {
		return refuse(CodeTooManyItems, "env", "at most %d variables", MaxEnvItems)
	}
	for k, v := range r.Env {
		if !envNamePattern.MatchString(k) || len(k) > MaxStringBytes {
			return refuse(CodeInvalidEnv, "env", "variable names must match [A-Za-z_][A-Za-z0-9_]*")
		}
		if !cleanText(v) {
			// The value is not echoed: env often carries secrets.
			return refuse(CodeInvalidEnv, "env."+k, "value must be valid UTF-8 of at most %d bytes with no NUL", MaxStringBytes)
		}
	}
	if err := r.Resources.validate("resources"); err != nil {
		return err
	}
	if r.MaxRuntimeSeconds < 0 || r.MaxRuntimeSeconds > MaxRuntimeSeconds {
		return refuse(CodeInvalidMaxRuntime, "max_runtime_seconds", "must be between 0 (no limit) and %d", MaxRuntimeSeconds)
	}
	if err := r.validatePlacement(); err != nil {
		return err
	}
	if err := r.validateScheduling(); err != nil {
		return err
	}
	if err := validateContainer("", r.Network, r.ShmBytes, r.Resources.MemoryBytes, r.Ulimits); err != nil {
		return err
	}
	if len(r.Labels) > MaxLabelItems {
		return refuse(CodeTooManyItems, "labels", "at most %d labels", MaxLabelItems)
	}
	for k, v := range r.Labels {
		if !labelKeyPattern.MatchString(k) || len(v) > 256 || !cleanText(v) {
			return refuse(CodeInvalidLabel, "labels", "keys match [A-Za-z0-9][A-Za-z0-9._/-]{0,62}, values are at most 256 bytes")
		}
	}
	return nil
}

var (
	cacheNamePattern  = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	capabilityPattern = regexp.MustCompile(`^[0-9]{1,3}(\.[0-9]{1,3}){0,2}$`)
)

// MaxCaches bounds cache mounts per Run.
const MaxCaches = 16

func (r *RunRequest) validatePlacement() error {
	if err := r.Platform.validate("platform"); err != nil {
		return err
	}
	if g := r.GPU; g != nil {
		if g.MinMemoryBytes < 0 {
			return refuse(CodeNegativeResource, "gpu.min_memory_bytes", "must be zero or positive")
		}
		if g.MinDriverCapability != "" && !capabilityPattern.MatchString(g.MinDriverCapability) {
			return refuse(CodeInvalidGPU, "gpu.min_driver_capability", "a version like 12.2")
		}
		if len(g.Model) > 128 || !cleanText(g.Model) {
			return refuse(CodeValueTooLong, "gpu.model", "valid UTF-8 of at most 128 bytes")
		}
		if r.Resources.GPUCount == 0 {
			return refuse(CodeInvalidGPU, "gpu", "a GPU requirement needs resources.gpu_count of at least 1")
		}
	}
	if len(r.Caches) > MaxCaches {
		return refuse(CodeTooManyItems, "caches", "at most %d cache mounts", MaxCaches)
	}
	seen := map[string]bool{}
	for i, c := range r.Caches {
		field := "caches[" + strconv.Itoa(i) + "]"
		switch {
		case !cacheNamePattern.MatchString(c.Name):
			return refuse(CodeInvalidCache, field+".name", "lowercase [a-z0-9._-], 1-63 characters")
		case c.CompatibilityKey != "" && !idPattern.MatchString(c.CompatibilityKey):
			return refuse(CodeInvalidCache, field+".compatibility_key", "1-128 characters of [A-Za-z0-9._:-]")
		case validateMountPath(field+".path", c.Path, CodeInvalidCache) != nil:
			return validateMountPath(field+".path", c.Path, CodeInvalidCache)
		case seen[c.Path]:
			return refuse(CodeInvalidCache, field+".path", "two caches mounted at one path")
		}
		seen[c.Path] = true
	}
	if err := r.validateArtifacts(seen); err != nil {
		return err
	}
	return r.validateSecretRefs(seen)
}

func (r Resources) validate(field string) error {
	for _, f := range []struct {
		name string
		v    int64
		max  int64
	}{{"cpu_millis", r.CPUMillis, MaxCPUMillis}, {"memory_bytes", r.MemoryBytes, MaxMemoryBytes}, {"gpu_count", r.GPUCount, MaxGPUCount}, {"disk_bytes", r.DiskBytes, MaxMemoryBytes}} {
		if f.v < 0 {
			return refuse(CodeNegativeResource, field+"."+f.name, "must be zero or positive")
		}
		if f.v > f.max {
			return refuse(CodeResourceTooLarge, field+"."+f.name, "must be at most %d", f.max)
		}
	}
	return nil
}

func validateStrings(field string, ss []string) error {
	if len(ss) > MaxCommandItems {
		return refuse(CodeTooManyItems, field, "at most %d items", MaxCommandItems)
	}
	for _, s := range ss {
		if !cleanText(s) {
			return refuse(CodeValueTooLong, field, "each item must be valid UTF-8 of at most %d bytes with no NUL", MaxStringBytes)
		}
	}
	return nil
}

// cleanText is what every free-text field must be: valid UTF-8 (JSON, the
// KV encoding, would otherwise silently rewrite it), no NUL, bounded.
func cleanText(s string) bool {
	return len(s) <= MaxStringBytes && utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

// ValidateID checks an identifier used in subjects, KV keys and Nats-Msg-Id.
func ValidateID(field, id string, code Code) error {
	if id == "" {
		return refuse(CodeMissingField, field, "required; use 1-128 characters of [A-Za-z0-9._:-]")
	}
	if !idPattern.MatchString(id) {
		return refuse(code, field, "must be 1-128 characters of [A-Za-z0-9._:-], starting with a letter or digit")
	}
	return nil
}

// RunIDFor derives the Run id from a tenant's request id, so redelivery
// and resubmission of one request always name the same Run, and the same
// request id in two tenants names two Runs. The default tenant's ids are
// the hash of the request id alone, as before tenants.
func RunIDFor(tenant, requestID string) string {
	in := requestID
	if tenant != DefaultTenant {
		in = tenant + "\x00" + requestID
	}
	sum := sha256.Sum256([]byte(in))
	return "r-" + hex.EncodeToString(sum[:12])
}

// DecodeRunRequest decodes and validates a submit message. The error is
// always a *Refusal.
func DecodeRunRequest(h nats.Header, data []byte) (RunRequest, codec.Encoding, error) {
	var req RunRequest
	enc := codec.Detect(h, data)
	if len(data) > MaxRunRequestBytes {
		return req, enc, refuse(CodePayloadTooLarge, "", "request is %d bytes; the limit is %d — move large inputs into an artifact or cache mount", len(data), MaxRunRequestBytes)
	}
	if err := decodeStrict(enc, data, &req); err != nil {
		return req, enc, err
	}
	return req, enc, req.Validate()
}

// decodeStrict decodes into v, turning codec errors into refusals.
func decodeStrict(enc codec.Encoding, data []byte, v any) error {
	err := codec.Decode(enc, data, v)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, codec.ErrUnknownField):
		return refuse(CodeUnknownField, unknownFieldName(err.Error()), "not a field of this message (schema version %d); remove it or upgrade the control plane", SchemaVersion)
	default:
		return refuse(CodeMalformed, "", "body is not a valid %s object of this message type: %s", enc, truncate(err.Error(), 200))
	}
}

// unknownFieldName extracts the quoted field name from a decoder's error.
func unknownFieldName(msg string) string {
	i := strings.Index(msg, `unknown field "`)
	if i < 0 {
		return ""
	}
	rest := msg[i+len(`unknown field "`):]
	if j := strings.IndexByte(rest, '"'); j >= 0 {
		return truncate(rest[:j], 64)
	}
	return ""
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
