package admission

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// authorizeRunLogs admits an agent's log connection for one Run
// (bus.NodeLogUser): the node's live session token, and the Run's current
// attempt booked on that node, in any phase (the tail of a finished attempt
// may still be on its way). It may publish that Run's output to WF_LOGS
// and nothing else (bus.PermsNodeLogs).
func (a *Callout) authorizeRunLogs(ctx context.Context, user, secret, h string) (grant, error) {
	nodeID, runID, ok := bus.ParseNodeLogUser(user)
	if !ok {
		return grant{}, &Refusal{User: user, Reason: "a log login's user is <node id>/<run id>, each without dots, slashes or wildcards (bus.NodeLogUser)"}
	}
	if !schemas.TokenWellFormed(secret) {
		return grant{}, &Refusal{User: user, Reason: "not a warmfleet token; a log login presents the node's session token (the one the agent logs in with)"}
	}
	rec, ok, err := a.nodeSession(ctx, nodeID, h)
	if err != nil {
		return grant{}, err
	}
	if !ok {
		return grant{}, &Refusal{User: user, Reason: "not the current session token of node " + nodeID +
			"; a log login presents the session token the agent logs in with (not its invitation), so it works only once the node has enrolled"}
	}
	if err := a.sessionRefusal(user, nodeID, rec); err != nil {
		return grant{}, err
	}
	var run schemas.Run
	_, err = bus.GetJSON(ctx, a.runsKV, runID, &run)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrInvalidKey):
		return grant{}, &Refusal{User: user, Reason: "no Run " + runID + " in " + bus.BucketRuns + "; an agent ships output only for Runs booked on it (`warmfleet run get " + runID + "`)"}
	case err != nil:
		return grant{}, fmt.Errorf("read run %s: %w", runID, err)
	case run.NodeID == "":
		return grant{}, &Refusal{User: user, Reason: fmt.Sprintf("Run %s's current attempt (%d) is booked on no node; an agent ships output only for the attempt booked on it", runID, run.Attempt)}
	case run.NodeID != nodeID:
		return grant{}, &Refusal{User: user, Reason: fmt.Sprintf("Run %s's current attempt (%d) is booked on node %s, not %s; an agent ships output only for the attempt booked on it", runID, run.Attempt, run.NodeID, nodeID)}
	}
	p := bus.PermsNodeLogs(nodeID, run.TenantOf(), runID)
	return grant{kind: "node-logs", name: user, perms: &p, expires: rec.SessionExpires}, nil
}
