package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// withLiveLeases replaces each record's lease with the live one a control
// plane holds. wf_nodes keeps a lease only as of the node's last state
// change (heartbeats write no KV), so without an answer the records are
// shown as stored and a note on stderr says so.
func withLiveLeases(ctx context.Context, conn *bus.Conn, nodes []schemas.NodeRecord) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	leases, err := liveLeases(ctx, conn)
	if err != nil {
		fmt.Fprintf(os.Stderr, "note: lease times are as of each node's last state change (%v)\n", err)
		return
	}
	for i, n := range nodes {
		if l, ok := leases[n.NodeID]; ok && l.FencingToken == n.FencingToken && l.LeaseExpires.After(n.LeaseExpires) {
			nodes[i].LeaseExpires = l.LeaseExpires
		}
	}
}

// liveLeases asks a control-plane replica for every node's live lease.
func liveLeases(ctx context.Context, conn *bus.Conn) (map[string]schemas.NodeLease, error) {
	resp, err := conn.NC.RequestWithContext(ctx, bus.SubjectNodeLeases, nil)
	if err != nil {
		return nil, fmt.Errorf("no control plane answered on %s: %w", bus.SubjectNodeLeases, err)
	}
	var rep schemas.Reply[[]schemas.NodeLease]
	if err := json.Unmarshal(resp.Data, &rep); err != nil {
		return nil, fmt.Errorf("leases reply: %w", err)
	}
	if rep.Refusal != nil {
		return nil, rep.Refusal
	}
	out := map[string]schemas.NodeLease{}
	if rep.OK != nil {
		for _, l := range *rep.OK {
			out[l.NodeID] = l
		}
	}
	return out, nil
}
