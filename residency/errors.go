package residency

import (
	"errors"
	"fmt"
	"strings"

	"github.com/warmfleet/warmfleet/residency/checkpoint"
	"github.com/warmfleet/warmfleet/schemas"
)

// Errors, matched with errors.Is. AttachError and ReleaseError wrap them.
var (
	// ErrInvalidRequest: the request or the principal is malformed.
	ErrInvalidRequest = errors.New("residency: invalid request")
	// ErrForbidden: the principal may not act on the session's tenant.
	ErrForbidden = errors.New("residency: principal not allowed for tenant")
	// ErrDraining: the host has begun draining and admits nothing new.
	ErrDraining = errors.New("residency: host is draining")
	// ErrCapacity: the admission ledger is full.
	ErrCapacity = errors.New("residency: admission capacity exhausted")
	// ErrBusy: the session is attaching, releasing or being surrendered on
	// this host; try again.
	ErrBusy = errors.New("residency: session busy on this host")
	// ErrLeaseHeld: another holder has a live lease on the session.
	ErrLeaseHeld = errors.New("residency: session lease held elsewhere")
	// ErrLeaseLost: the grant is no longer held (renewal conflict, expiry,
	// or release).
	ErrLeaseLost = errors.New("residency: session lease lost")
	// ErrEpochSuperseded: a write under an epoch lower than the stored one
	// (or the current lease's) was refused.
	ErrEpochSuperseded = errors.New("residency: epoch superseded")
	// ErrTombstoned: the residency at this epoch was already released; its
	// route cannot be published again.
	ErrTombstoned = errors.New("residency: residency tombstoned at this epoch")
	// ErrStaleEpoch: a fence check refused to act. It wraps the reason
	// (ErrLeaseLost or ErrEpochSuperseded) as well.
	ErrStaleEpoch = errors.New("residency: fence refused: epoch is stale")
	// ErrRuntimeMismatch: the durable state was written by another runtime
	// build than the one this host launches, or the request names another.
	ErrRuntimeMismatch = errors.New("residency: runtime compatibility id mismatch")
	// ErrNamespaceMissing: the durable store answered with no namespace.
	ErrNamespaceMissing = errors.New("residency: durable namespace missing")
	// ErrJournalUnknown: a create over a runtime journal whose state the
	// store could not establish.
	ErrJournalUnknown = errors.New("residency: runtime journal state unknown")
	// ErrSessionNotFound: a resume of a session with no durable state.
	ErrSessionNotFound = errors.New("residency: session has no durable state")
	// ErrSessionExists: a create of a session that already has durable state
	// or a runtime journal.
	ErrSessionExists = errors.New("residency: session already exists")
	// ErrNotResident: the session is not resident on this host.
	ErrNotResident = errors.New("residency: session not resident here")
	// ErrIllegalTransition: a lifecycle event not allowed in the phase.
	ErrIllegalTransition = errors.New("residency: illegal lifecycle transition")
	// ErrReleaseAborted: the runtime (or a step before it) refused to
	// release; the session went back to resident under the same generation.
	ErrReleaseAborted = errors.New("residency: release aborted, session still resident")
	// ErrClosed: the Manager is closed.
	ErrClosed = errors.New("residency: manager closed")
	// ErrNotLeaseHolder: a lease, route or checkpoint write whose caller
	// does not hold the session's lease now: no lease, another holder, or
	// an epoch or grant other than the stored lease's (a higher one
	// included). It is also ErrEpochSuperseded and ErrLeaseLost, so a host
	// that ever met it gives its grant up rather than write on.
	ErrNotLeaseHolder error = notLeaseHolder{}
	// ErrNotPlaced: a lease acquire for a session the control plane has not
	// placed on the asking node (no attach of it to that node in flight).
	ErrNotPlaced = errors.New("residency: session not placed on this node")
	// ErrCheckpointRequired: a resume of a session whose durable state
	// holds no workspace checkpoint, on a target that requires one.
	ErrCheckpointRequired = errors.New("residency: no workspace checkpoint to resume from")
)

// notLeaseHolder is ErrNotLeaseHolder's type: one sentinel that matches the
// two a host already gives a grant up for.
type notLeaseHolder struct{}

func (notLeaseHolder) Error() string { return "residency: caller does not hold the session's lease" }

func (notLeaseHolder) Is(target error) bool {
	return target == ErrEpochSuperseded || target == ErrLeaseLost
}

// Code classifies a refusal for a caller that answers on the wire: an
// AttachError carries one, and a reply's schemas.SessionError carries one
// (wire.go).
type Code = schemas.SessionCode

// Codes for the sentinel errors above (see sentinelCodes), and the codes an
// attach falls back to when its cause is none of them (see codeFor).
const (
	CodeInvalidRequest   Code = "invalid_request"
	CodeForbidden        Code = "forbidden"
	CodeDraining         Code = "draining"
	CodeCapacity         Code = "capacity"
	CodeBusy             Code = "busy"
	CodeLeaseHeld        Code = "lease_held"
	CodeLeaseLost        Code = "lease_lost"
	CodeSuperseded       Code = "epoch_superseded"
	CodeTombstoned       Code = "tombstoned"
	CodeRuntimeMismatch  Code = "runtime_mismatch"
	CodeNamespaceMissing Code = "namespace_missing"
	CodeJournalUnknown   Code = "journal_unknown"
	CodeNotFound         Code = "session_not_found"
	CodeExists           Code = "session_exists"
	CodeNotResident      Code = "not_resident"
	CodeReleaseAbort     Code = "release_aborted"
	CodeUnavailable      Code = "unavailable"
	CodeWorkspace        Code = "workspace_failed"
	CodeLaunch           Code = "launch_failed"
	CodePublish          Code = "publish_failed"
	CodeInbox            Code = "inbox_failed"
	CodeClosed           Code = "closed"
	CodeNotLeaseHolder   Code = "not_lease_holder"
	CodeNotPlaced        Code = "not_placed_here"
	CodeCheckpointNeeded Code = "checkpoint_required"
)

// Codes a reply carries that stand for no sentinel error.
const (
	CodeReleaseError Code = "release_incomplete"
	CodeStaleNode    Code = "stale_fencing_token"
	CodeNoHost       Code = "no_session_host"
)

// sentinelCodes is the one table from sentinel error to code: codeFor
// derives an AttachError's code from it, ToWire encodes an error with it,
// and sentinelOf decodes a code back to its sentinel, so a code names the
// same sentinel on both sides of a reply. It is read in order and the first
// sentinel an error matches wins.
//
// ErrTombstoned has its own code rather than CodeSuperseded because a code
// is how a sentinel crosses the wire: under CodeSuperseded a publish over
// the host's own tombstone, made through Remote, would come back as
// ErrEpochSuperseded, where TestRemote_TypedErrorsAndIdentity
// (controlplane/sessions/residency_test.go) requires ErrTombstoned.
var sentinelCodes = []struct {
	err  error
	code Code
}{
	{ErrInvalidRequest, CodeInvalidRequest},
	{ErrForbidden, CodeForbidden},
	{ErrDraining, CodeDraining},
	{ErrCapacity, CodeCapacity},
	{ErrBusy, CodeBusy},
	{ErrLeaseHeld, CodeLeaseHeld},
	{ErrNotLeaseHolder, CodeNotLeaseHolder},
	{ErrNotPlaced, CodeNotPlaced},
	{ErrTombstoned, CodeTombstoned},
	{ErrEpochSuperseded, CodeSuperseded},
	{ErrLeaseLost, CodeLeaseLost},
	{ErrRuntimeMismatch, CodeRuntimeMismatch},
	{ErrNamespaceMissing, CodeNamespaceMissing},
	{ErrJournalUnknown, CodeJournalUnknown},
	{ErrSessionNotFound, CodeNotFound},
	{ErrSessionExists, CodeExists},
	{ErrNotResident, CodeNotResident},
	{ErrReleaseAborted, CodeReleaseAbort},
	{ErrClosed, CodeClosed},
	{ErrCheckpointRequired, CodeCheckpointNeeded},
	{checkpoint.ErrInvalid, Code(checkpoint.CodeInvalid)},
	{checkpoint.ErrCorrupt, Code(checkpoint.CodeCorrupt)},
	{checkpoint.ErrIncomplete, Code(checkpoint.CodeIncomplete)},
}

// codeOf is the code of the first sentinel in sentinelCodes that err
// matches; false when it matches none.
func codeOf(err error) (Code, bool) {
	for _, s := range sentinelCodes {
		if errors.Is(err, s.err) {
			return s.code, true
		}
	}
	return "", false
}

// sentinelOf is the sentinel c stands for in sentinelCodes; nil when none.
func sentinelOf(c Code) error {
	for _, s := range sentinelCodes {
		if s.code == c {
			return s.err
		}
	}
	return nil
}

// codeFor derives the code from the cause, falling back to the step's own.
func codeFor(step Step, err error) Code {
	if c, ok := codeOf(err); ok {
		return c
	}
	switch step {
	case StepValidate:
		return CodeInvalidRequest
	case StepWorkspace:
		return CodeWorkspace
	case StepLaunch:
		return CodeLaunch
	case StepAttaching, StepResident:
		return CodePublish
	case StepConsume:
		return CodeInbox
	default:
		return CodeUnavailable
	}
}

// AttachError is a refused or failed attach. Unreleased tells "failed and
// took nothing" (empty) from "failed and something is still held".
type AttachError struct {
	Step   Step
	Code   Code
	Key    Key
	Reason string
	Cause  error

	// RuntimeCompatibilityID is the build this host launches, set exactly
	// when Code is runtime_mismatch: what the host offers, never the
	// caller's value or the durable state's.
	RuntimeCompatibilityID string

	// Unreleased names every compensation that itself failed ("lease",
	// "admission", "workspace", "runtime", "location", "heartbeat").
	// A refusal that only says the resource is not ours any more (a lost
	// grant, a superseded route) is not a leak and is not listed.
	Unreleased []string
	// UnreleasedCauses are the errors behind Unreleased, index for index.
	UnreleasedCauses []error
}

func (e *AttachError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "residency: attach %s failed at step %d (%s): %s", e.Key, int(e.Step), e.Step, e.Code)
	if e.Reason != "" {
		b.WriteString(": " + e.Reason)
	}
	if e.Cause != nil {
		b.WriteString(": " + e.Cause.Error())
	}
	if len(e.Unreleased) > 0 {
		fmt.Fprintf(&b, " (still held: %s)", strings.Join(e.Unreleased, ", "))
	}
	return b.String()
}

// Unwrap exposes the cause to errors.Is and errors.As.
func (e *AttachError) Unwrap() error { return e.Cause }

// TookNothing reports whether every compensation succeeded.
func (e *AttachError) TookNothing() bool { return len(e.Unreleased) == 0 }

// ReleaseError is a release that did not complete cleanly.
type ReleaseError struct {
	Key Key
	// Aborted is set when the release went back to resident (the runtime
	// refused to release, or a step before it failed): nothing was dropped.
	Aborted bool
	// Cause is the first failure, typed.
	Cause error
	// Step is the step an aborted release stopped at ("location",
	// "inbox", "checkpoint", "runtime").
	Step string
	// Unwritten names each teardown that failed, in order ("location",
	// "lease", "workspace", "runtime"), for the same reason as
	// AttachError.Unreleased.
	Unwritten []string
	// Causes are the errors behind Unwritten, index for index.
	Causes []error
}

func (e *ReleaseError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "residency: release %s", e.Key)
	if e.Aborted {
		b.WriteString(" aborted (still resident)")
	} else {
		b.WriteString(" incomplete")
	}
	if e.Cause != nil {
		b.WriteString(": " + e.Cause.Error())
	}
	if len(e.Unwritten) > 0 {
		fmt.Fprintf(&b, " (not released: %s)", strings.Join(e.Unwritten, ", "))
	}
	return b.String()
}

// Unwrap exposes the cause, and ErrReleaseAborted when aborted.
func (e *ReleaseError) Unwrap() []error {
	var errs []error
	if e.Cause != nil {
		errs = append(errs, e.Cause)
	}
	if e.Aborted {
		errs = append(errs, ErrReleaseAborted)
	}
	return errs
}

// InvalidOptionsError is a Manager (or store) configuration refused by New.
type InvalidOptionsError struct {
	Field  string
	Reason string
}

func (e *InvalidOptionsError) Error() string {
	return "residency: invalid options: " + e.Field + ": " + e.Reason
}
