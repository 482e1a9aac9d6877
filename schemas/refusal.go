package schemas

import (
	"errors"
	"fmt"
	"time"

	"github.com/warmfleet/warmfleet/bus/codec"
)

// Code is a stable, machine-readable reason for a refusal.
type Code string

// Refusal codes. They are part of the wire contract: never renumber or reuse.
const (
	CodeMalformed          Code = "malformed_payload"
	CodeUnknownField       Code = "unknown_field"
	CodePayloadTooLarge    Code = "payload_too_large"
	CodeUnsupportedVersion Code = "unsupported_version"
	CodeMissingField       Code = "missing_field"
	CodeInvalidRequestID   Code = "invalid_request_id"
	CodeInvalidRunID       Code = "invalid_run_id"
	CodeImageNotPinned     Code = "image_not_pinned"
	CodeInvalidImage       Code = "invalid_image_reference"
	CodeInvalidDigest      Code = "invalid_digest"
	CodeNegativeResource   Code = "negative_resource"
	CodeResourceTooLarge   Code = "resource_too_large"
	CodeInvalidEnv         Code = "invalid_env"
	CodeTooManyItems       Code = "too_many_items"
	CodeValueTooLong       Code = "value_too_long"
	CodeInvalidMaxRuntime  Code = "invalid_max_runtime"
	CodeInvalidLabel       Code = "invalid_label"
	CodeInvalidGrace       Code = "invalid_grace"
	CodeRunNotFound        Code = "run_not_found"
	CodeNoCapacity         Code = "no_capacity"
	CodeUnsatisfiable      Code = "unsatisfiable"
	CodeInvalidPlatform    Code = "invalid_platform"
	CodeInvalidGPU         Code = "invalid_gpu_requirement"
	CodeInvalidCache       Code = "invalid_cache_mount"
	CodeRequestIDConflict  Code = "request_id_conflict"
	CodeCancelled          Code = "cancelled"
	CodeMaxRuntime         Code = "max_runtime_exceeded"
	CodeExitNonZero        Code = "exit_nonzero"
	CodeOOMKilled          Code = "oom_killed"
	CodeLaunchFailed       Code = "launch_failed"
	CodeNodeLost           Code = "node_lost"
	CodeAttemptsExhausted  Code = "attempts_exhausted"
	CodeInvalidNetwork     Code = "invalid_network"
	CodeInvalidShm         Code = "invalid_shm_bytes"
	CodeInvalidUlimit      Code = "invalid_ulimit"
	// CodeNetworkUnavailable refuses a launch whose network mode the node
	// does not offer (ReasonNetworkUnavailable, placement's twin).
	CodeNetworkUnavailable Code = "network_unavailable"
	// CodePlatformNotInImage fails an attempt whose image (an index, or a
	// single manifest) has no build for the platform it is to run as.
	CodePlatformNotInImage Code = "platform_not_in_image"
	// CodeInvalidSelector refuses a prefetch's node selector.
	CodeInvalidSelector Code = "invalid_node_selector"
	// CodeNoPrefetchTarget refuses a prefetch no live node matches.
	CodeNoPrefetchTarget Code = "no_prefetch_target"
	// CodePrefetchTimedOut fails a node's prefetch entry that had no
	// answer by the prefetch's deadline.
	CodePrefetchTimedOut Code = "prefetch_timed_out"
	// CodeRegistryAuthFailed fails a Run whose image registry refused the
	// pull (401/403) with the credential the control plane gave, or with
	// none, or whose credential the control plane could not get. A
	// registry that refuses one node refuses every node: terminal.
	CodeRegistryAuthFailed Code = "registry_auth_failed"
	// CodeRentBeatsQueue is the decision code of a Run that waits for a
	// rental because a fresh machine starts it sooner than any busy
	// node's queue.
	CodeRentBeatsQueue Code = "rent_beats_queue"

	// Node-facing codes.
	CodeStaleFencingToken Code = "stale_fencing_token"
	CodeStaleGeneration   Code = "stale_generation"
	CodeUnknownNode       Code = "unknown_node"
	CodeTokenRequired     Code = "enrollment_token_required"
	CodeTokenUnknown      Code = "enrollment_token_unknown"
	CodeTokenExpired      Code = "enrollment_token_expired"
	CodeTokenMalformed    Code = "enrollment_token_malformed"
	CodeWrongRental       Code = "wrong_rental"
	CodeSessionInvalid    Code = "session_invalid"
	CodeSessionExpired    Code = "session_expired"
	CodeSuperseded        Code = "session_superseded"
	CodeWrongNode         Code = "wrong_node"
	// CodeNotBookedHere refuses a node's receipt or workload report about
	// an attempt the control plane booked on another node.
	CodeNotBookedHere Code = "attempt_not_booked_here"
	// CodeNodeNotLive refuses an operator's request for a node that holds
	// no live lease (or whose agent does not answer): nothing would act on it.
	CodeNodeNotLive Code = "node_not_live"
	// CodeImageNotWanted refuses a registry credential for an image the
	// node has no live booking or prefetch for.
	CodeImageNotWanted Code = "image_not_wanted"
	// CodeCredentialUnavailable: the control plane holds a credential
	// source for the registry, but it failed (a credential helper that
	// failed, hung or answered garbage).
	CodeCredentialUnavailable Code = "registry_credential_unavailable"
	// CodeInvalidArtifact refuses a malformed artifact use, record or
	// source, naming the field.
	CodeInvalidArtifact Code = "invalid_artifact"
	// CodeArtifactUnknown refuses a Run naming an artifact (or version or
	// digest) the catalog does not hold.
	CodeArtifactUnknown Code = "artifact_unknown"
	// CodeArtifactOwned refuses an operator's registration of a name and
	// version that another tenant's record holds.
	CodeArtifactOwned Code = "artifact_owned"
	// CodeArtifactDigestMismatch: bytes did not hash to the artifact's
	// digest (a put's file, or what a source served); they are discarded.
	CodeArtifactDigestMismatch Code = "artifact_digest_mismatch"
	// CodeArtifactFetchFailed: the node could not fetch the artifact's
	// bytes (source unreachable, gone, or the node's disk failed).
	CodeArtifactFetchFailed Code = "artifact_fetch_failed"
	// CodeArtifactSourceAuthFailed: the source refused the credential the
	// control plane gave, or the control plane refused the node one.
	CodeArtifactSourceAuthFailed Code = "artifact_source_auth_failed"
	// CodeArtifactNotWanted refuses a source credential for an artifact the
	// node has no live booking or prefetch for.
	CodeArtifactNotWanted Code = "artifact_not_wanted"
	// CodeRateLimited refuses a node's request beyond its per-node rate
	// limit; the refusal's RetryAfterMillis says when to ask again.
	CodeRateLimited Code = "rate_limited"
	CodeInternal    Code = "internal"
)

// Startup refusals of an insecure setup (docs/security.md).
const (
	// CodeAuthRequired refuses `warmfleet serve` listening beyond loopback
	// without --auth (override: --insecure-no-auth).
	CodeAuthRequired Code = "auth_required"
	// CodeTLSRequired refuses an agent logging in (--nats-auth) over a
	// connection without TLS, where its token would cross in clear
	// (override: --insecure-auth-without-tls).
	CodeTLSRequired Code = "tls_required"
)

// Refusal is a coded, operator-readable refusal of one input. Field names the
// offending field in its wire (json) spelling; Reason says what class of value
// was wrong and what to do. Refusals never echo secret values.
type Refusal struct {
	Code   Code   `json:"code"`
	Field  string `json:"field,omitempty"`
	Reason string `json:"reason"`
	// RetryAfterMillis, on a CodeRateLimited refusal, is how long the
	// sender waits before it asks again.
	RetryAfterMillis int64 `json:"retry_after_ms,omitempty"`
}

// RetryAfter is how long to wait before asking again; zero when the
// refusal does not say.
func (r *Refusal) RetryAfter() time.Duration {
	return time.Duration(r.RetryAfterMillis) * time.Millisecond
}

func (r *Refusal) Error() string {
	if r.Field == "" {
		return fmt.Sprintf("%s: %s", r.Code, r.Reason)
	}
	return fmt.Sprintf("%s: field %q: %s", r.Code, r.Field, r.Reason)
}

// Is makes errors.Is(err, &Refusal{Code: c}) match any refusal with code c.
func (r *Refusal) Is(target error) bool {
	t, ok := target.(*Refusal)
	return ok && t.Code == r.Code && (t.Field == "" || t.Field == r.Field)
}

func refuse(code Code, field, format string, args ...any) *Refusal {
	return &Refusal{Code: code, Field: field, Reason: fmt.Sprintf(format, args...)}
}

// AsRefusal returns err's Refusal, or an internal refusal wrapping its text
// when err is not one.
func AsRefusal(err error) *Refusal {
	var r *Refusal
	if errors.As(err, &r) {
		return r
	}
	return &Refusal{Code: CodeInternal, Reason: err.Error()}
}

// RefusalOfInput turns a decode or validation error of a request body into
// a refusal that does not echo the input; what names the body expected.
func RefusalOfInput(err error, what string) *Refusal {
	if errors.Is(err, codec.ErrUnknownField) {
		return &Refusal{Code: CodeUnknownField, Reason: what + ": it has a field this control plane does not know"}
	}
	if errors.Is(err, codec.ErrMalformed) {
		return &Refusal{Code: CodeMalformed, Reason: what}
	}
	return AsRefusal(err)
}
