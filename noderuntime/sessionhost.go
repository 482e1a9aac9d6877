package noderuntime

import (
	"context"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
)

// SessionHost hosts long-lived sessions on this node, each resident here
// under a fenced lease epoch (package residency/nodehost implements it over
// the residency Manager). The agent starts it once enrolled and stops it with
// the agent; it is optional.
type SessionHost interface {
	// Serve hosts sessions until ctx ends.
	Serve(ctx context.Context, env SessionHostEnv) error
}

// SessionHostEnv is what the agent hands its SessionHost.
type SessionHostEnv struct {
	NodeID string
	// Conn is the agent's own connection: the host publishes only under
	// wf.node.<id>.> and pulls its sessions' inbox consumers.
	Conn *bus.Conn
	// Runtime is the agent's node runtime; a session's runtime is a
	// workload in it, so facts and reconciliation see it. A workload
	// launched with LabelResidencySession and LabelResidencyTenant keeps
	// its output where the agent ships it to its session's log subject,
	// until it is removed.
	Runtime Runtime
	Log     *zap.Logger
	// FencingToken is the current enrollment's token. A session command
	// stamped with another is refused.
	FencingToken func() uint64
}

// LabelResidencySession marks a workload as a resident session's runtime
// (its value is the session id); package residency sets it on every session
// workload. Such workloads belong to the SessionHost: the agent's own
// reconciliation does not report them as Run workloads.
const LabelResidencySession = "warmfleet.residency/session"

// LabelResidencyTenant is a session workload's tenant; with
// LabelResidencySession it names the subject its output is shipped on.
const LabelResidencyTenant = "warmfleet.residency/tenant"

// IsSessionWorkload reports whether st is a resident session's runtime.
func IsSessionWorkload(st WorkloadStatus) bool { return st.Labels[LabelResidencySession] != "" }
