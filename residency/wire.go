package residency

import (
	"errors"
	"fmt"
	"time"
)

// WireError is an error as it travels in a reply: a code a caller branches
// on, and text for an operator. ToWire and WireError.Unwrap translate
// between a code and its sentinel through the one table, sentinelCodes
// (errors.go), so errors.Is works across the wire.
type WireError struct {
	Code    Code   `json:"code"`
	Message string `json:"message"`
	// Step and Unreleased are set for a failed attach (see AttachError).
	Step       string   `json:"step,omitempty"`
	Unreleased []string `json:"unreleased,omitempty"`
	// Unwritten is set for a failed release (see ReleaseError).
	Unwritten []string `json:"unwritten,omitempty"`
}

func (e *WireError) Error() string {
	s := string(e.Code) + ": " + e.Message
	if len(e.Unreleased) > 0 {
		s += fmt.Sprintf(" (still held: %v)", e.Unreleased)
	}
	if len(e.Unwritten) > 0 {
		s += fmt.Sprintf(" (not written: %v)", e.Unwritten)
	}
	return s
}

// Unwrap is the sentinel the code stands for, if any.
func (e *WireError) Unwrap() error { return sentinelOf(e.Code) }

// Codes a WireError carries that stand for no sentinel error.
const (
	CodeReleaseError Code = "release_incomplete"
	CodeStaleNode    Code = "stale_fencing_token"
	CodeNoHost       Code = "no_session_host"
)

// ToWire encodes err for a reply; nil stays nil.
func ToWire(err error) *WireError {
	if err == nil {
		return nil
	}
	var we *WireError
	if errors.As(err, &we) {
		return we
	}
	w := &WireError{Code: CodeUnavailable, Message: err.Error()}
	var ae *AttachError
	if errors.As(err, &ae) {
		w.Code, w.Step, w.Unreleased = ae.Code, ae.Step.String(), ae.Unreleased
		return w
	}
	if c, ok := codeOf(err); ok {
		w.Code = c
	}
	var re *ReleaseError
	if errors.As(err, &re) {
		if w.Code == CodeUnavailable {
			w.Code = CodeReleaseError
		}
		w.Unwritten = re.Unwritten
	}
	return w
}

// ErrorFromWire is the error a reply carried; nil stays nil.
func ErrorFromWire(w *WireError) error {
	if w == nil {
		return nil
	}
	return w
}

// SessionOp names an operation an agent serves on wf.node.<id>.sessions.<op>.
type SessionOp string

// Session operations.
const (
	OpAttach  SessionOp = "attach"
	OpRelease SessionOp = "release"
	OpList    SessionOp = "list"
	OpDrain   SessionOp = "drain"
)

// SessionCommand is the control plane's request to a node's session host.
type SessionCommand struct {
	// FencingToken is the node session the control plane addresses; a host
	// whose enrollment holds another refuses (CodeStaleNode).
	FencingToken    uint64 `json:"fencing_token"`
	Tenant          string `json:"tenant,omitempty"`
	Session         string `json:"session,omitempty"`
	Mode            Mode   `json:"mode,omitempty"`
	CompatibilityID string `json:"compatibility_id,omitempty"`
	Actor           string `json:"actor,omitempty"`
	Trace           string `json:"trace,omitempty"`
	// GPUs are the cards booked to the session on this host, by UUID, and
	// Devices their CDI devices, in the same order.
	GPUs    []string `json:"gpus,omitempty"`
	Devices []string `json:"devices,omitempty"`
}

// Key is the command's session.
func (c SessionCommand) Key() Key { return Key{Tenant: c.Tenant, Session: c.Session} }

// ResidencyView is a residency as reported over the wire.
type ResidencyView struct {
	Tenant          string         `json:"tenant"`
	Session         string         `json:"session"`
	Host            string         `json:"host"`
	Epoch           ResidencyEpoch `json:"lease_epoch"`
	Generation      uint64         `json:"generation"`
	Phase           Phase          `json:"phase"`
	Workload        string         `json:"workload,omitempty"`
	Namespace       string         `json:"namespace,omitempty"`
	CompatibilityID string         `json:"compatibility_id,omitempty"`
	Attached        bool           `json:"attached"`
}

// ViewOf is r as a ResidencyView.
func ViewOf(r Residency) ResidencyView {
	return ResidencyView{Tenant: r.Key.Tenant, Session: r.Key.Session, Host: r.Host, Epoch: r.Epoch, Generation: r.Generation,
		Phase: r.Phase, Workload: r.Workload, Namespace: r.Namespace, CompatibilityID: r.CompatibilityID, Attached: r.Attached}
}

// DrainView is a drain's report over the wire.
type DrainView struct {
	Node     string         `json:"node"`
	Released []Key          `json:"released"`
	Gone     []Key          `json:"gone,omitempty"`
	Failures []DrainFailure `json:"failures,omitempty"`
	// Error is set when the drain could not run at all (the node did not
	// answer, or answered with a refusal).
	Error *WireError `json:"error,omitempty"`
}

// DrainFailure is one session a drain could not release cleanly.
type DrainFailure struct {
	Key       Key      `json:"key"`
	Unwritten []string `json:"unwritten,omitempty"`
	Reason    string   `json:"reason"`
}

// DrainViewOf is rep as a DrainView.
func DrainViewOf(node string, rep DrainReport) DrainView {
	v := DrainView{Node: node, Released: rep.Released, Gone: rep.Gone}
	if v.Released == nil {
		v.Released = []Key{}
	}
	for _, f := range rep.Failures {
		reason := "release failed"
		if f.Cause != nil {
			reason = f.Cause.Error()
		}
		v.Failures = append(v.Failures, DrainFailure{Key: f.Key, Unwritten: f.Unwritten, Reason: reason})
	}
	return v
}

// SessionReply is a session host's answer to a SessionCommand, and the
// control plane's to an operator's session request.
type SessionReply struct {
	Residency   *ResidencyView  `json:"residency,omitempty"`
	Residencies []ResidencyView `json:"residencies,omitempty"`
	Drain       *DrainView      `json:"drain,omitempty"`
	Error       *WireError      `json:"error,omitempty"`
}

// SessionRequest is an operator's request on wf.admin.session.*.
type SessionRequest struct {
	Tenant  string `json:"tenant"`
	Session string `json:"session"`
	// Mode is create or resume (attach only); resume when empty and the
	// session has durable state, create otherwise.
	Mode Mode `json:"mode,omitempty"`
	// Node pins the attach to one node; any ready node that fits when empty.
	Node            string `json:"node,omitempty"`
	CompatibilityID string `json:"compatibility_id,omitempty"`
	Actor           string `json:"actor,omitempty"`
	// GPUCount is how many cards the session holds while resident (attach
	// only); the control plane books them on the node it chooses.
	GPUCount int64 `json:"gpu_count,omitempty"`
}

// Key is the request's session.
func (r SessionRequest) Key() Key { return Key{Tenant: r.Tenant, Session: r.Session} }

// DefaultRequestTimeout bounds one request/reply exchange of this package.
const DefaultRequestTimeout = 10 * time.Second
