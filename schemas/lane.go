package schemas

import "strings"

// The ephemeral lane: a Run that allows it (RunRequest.Ephemeral) may run
// as one execution on a provider's serverless product instead of on a
// node, when that starts it sooner than any node or rental. Its attempt is
// booked on the lane's pseudo-node, LaneNodeID(connection), which is never
// a node id (a node id has no '/').

// LaneNodePrefix starts every lane pseudo-node id.
const LaneNodePrefix = "lane/"

// LaneNodeID is the pseudo-node a connection's executions are booked on.
func LaneNodeID(connection string) string { return LaneNodePrefix + connection }

// LaneOf reports the lane connection a node id names, if it names one.
func LaneOf(nodeID string) (string, bool) { return strings.CutPrefix(nodeID, LaneNodePrefix) }

// Execution is a Run attempt's execution on the ephemeral lane: where it
// was sent and, once the provider answered, its id there. The launch key is
// the attempt id.
type Execution struct {
	Connection  string `json:"connection"`
	OfferID     string `json:"offer_id"`
	ExecutionID string `json:"execution_id,omitempty"`
}

// LaneIneligible says why a Run cannot run on the ephemeral lane at all
// ("" when it can): a lane execution gets no node, so nothing a node
// provides — secrets delivered at launch, caches, artifacts, a network
// mode other than the default — travels with it.
func (r *RunRequest) LaneIneligible() string {
	switch {
	case !r.Ephemeral:
		return "the Run does not allow the ephemeral lane (ephemeral: false)"
	case len(r.SecretEnv) > 0 || len(r.SecretFiles) > 0:
		return "a Run with secrets runs on a node (secrets are delivered to a node at launch, never in a provider's request)"
	case len(r.Caches) > 0 || len(r.Artifacts) > 0:
		return "a Run with caches or artifacts runs on a node"
	case r.Network != "" && r.Network != NetworkBridge:
		return "a Run asking for network " + r.Network + " runs on a node"
	}
	return ""
}
