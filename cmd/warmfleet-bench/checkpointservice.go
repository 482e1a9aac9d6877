package main

import (
	"context"
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/cache"
	"github.com/warmfleet/warmfleet/controlplane/sessions"
	"github.com/warmfleet/warmfleet/residency"
	"github.com/warmfleet/warmfleet/schemas"
)

// checkpointService is the control plane's session services on their own
// connection, and a node's connection to them: the path a session host's
// checkpoints take.
type checkpointService struct {
	conn   *bus.Conn
	stop   func()
	node   *nats.Conn
	remote *residency.Remote
	obs    jetstream.ObjectStore
}

const benchNode = "bench-node"

func startCheckpointService(ctx context.Context, url string) (*checkpointService, error) {
	conn, err := bus.Connect(url, "checkpoint-bench-cp", zap.NewNop())
	if err != nil {
		return nil, err
	}
	cp := &checkpointService{conn: conn}
	if err := cp.start(ctx, url); err != nil {
		cp.close()
		return nil, err
	}
	return cp, nil
}

func (cp *checkpointService) start(ctx context.Context, url string) error {
	if err := bus.Provision(ctx, cp.conn.JS, bus.Topology{}); err != nil {
		return err
	}
	nodes, err := cp.conn.JS.KeyValue(ctx, bus.BucketNodes)
	if err != nil {
		return err
	}
	// Leases outlive the rounds: the bench renews none.
	svc := sessions.New(sessions.Config{LeaseTTL: time.Hour}, cp.conn, cache.New(), nodes, nil, nil, zap.NewNop())
	if cp.stop, err = svc.Serve(ctx); err != nil {
		return err
	}
	if cp.node, err = nats.Connect(url, nats.Name(benchNode)); err != nil {
		return err
	}
	cp.remote = &residency.Remote{NC: cp.node, NodeID: benchNode, Timeout: time.Minute}
	cp.obs, err = cp.conn.JS.ObjectStore(ctx, bus.ObjectBucketCheckpoints)
	return err
}

func (cp *checkpointService) close() {
	if cp.stop != nil {
		cp.stop()
	}
	if cp.node != nil {
		cp.node.Close()
	}
	cp.conn.Close()
}

// holder places key on the bench's node, as an operator's attach does,
// takes its lease there and returns the node's checkpoint store for it.
func (cp *checkpointService) holder(ctx context.Context, key residency.Key) (*residency.RemoteCheckpoints, error) {
	b, err := json.Marshal(schemas.SessionPlacement{Tenant: key.Tenant, Session: key.Session, Node: benchNode, ExpiresAt: time.Now().Add(time.Hour)})
	if err != nil {
		return nil, err
	}
	leases, err := cp.conn.JS.KeyValue(ctx, bus.BucketLeases)
	if err != nil {
		return nil, err
	}
	if _, err := leases.Put(ctx, bus.SessionPlacementKey(key.Tenant, key.Session), b); err != nil {
		return nil, err
	}
	g, err := cp.remote.AcquireSessionLease(ctx, key, benchNode)
	if err != nil {
		return nil, err
	}
	return &residency.RemoteCheckpoints{Remote: cp.remote, Key: key, Epoch: g.Epoch}, nil
}
