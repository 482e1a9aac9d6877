package sessions_test

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/residency"
	"github.com/warmfleet/warmfleet/schemas"
)

// lossyLink is node-1's link to the control plane through a NATS server of
// its own: its residency requests are relayed to the service, and the
// answers of the first drop lease acquires are lost on the way back (the
// service granted them; the node never heard). It returns the node's end.
func lossyLink(t *testing.T, cp *nats.Conn, drop int32) *nats.Conn {
	t.Helper()
	server := testenv.StartNATS(t)
	edge := testenv.Dial(t, server.URL(), "relay").NC
	var acquires atomic.Int32
	prefix := bus.NodeResidencyService("node-1", "")
	sub, err := edge.Subscribe(bus.NodeResidencyService("node-1", ">"), func(m *nats.Msg) {
		resp, err := cp.RequestMsg(&nats.Msg{Subject: m.Subject, Data: m.Data, Header: m.Header}, 5*time.Second)
		if err != nil {
			return
		}
		if strings.TrimPrefix(m.Subject, prefix) == string(schemas.ResidencyLeaseAcquire) && acquires.Add(1) <= drop {
			return
		}
		_ = m.RespondMsg(&nats.Msg{Data: resp.Data, Header: resp.Header})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := edge.Flush(); err != nil {
		t.Fatal(err)
	}
	return testenv.Dial(t, server.URL(), "node-1").NC
}

// An acquire whose answers are lost may have granted the lease: the node is
// told it owes a release (a *LeaseCleanupError), and that release gives the
// grant back, so the session is free at once rather than held against every
// attach, the node's own included, until the lease's TTL runs out.
func TestRemote_LostAcquireOwesARelease(t *testing.T) {
	f := newFixture(t)
	nc := f.agentConn(t)
	ctx := testCtx(t)
	edge := lossyLink(t, nc, 2)
	key := residency.Key{Tenant: tenant, Session: "lost-grant"}
	f.place(t, key, "node-1")

	lossy := &residency.Remote{NC: edge, NodeID: "node-1", Timeout: 300 * time.Millisecond}
	_, err := lossy.AcquireSessionLease(ctx, key, "node-1")
	var owed *residency.LeaseCleanupError
	if !errors.As(err, &owed) || !errors.Is(err, residency.ErrServiceUnavailable) {
		t.Fatalf("acquire with both answers lost: %v, want a *LeaseCleanupError over ErrServiceUnavailable", err)
	}
	direct := remote(nc, "node-1")
	if _, err := direct.AcquireSessionLease(ctx, key, "node-1"); !errors.Is(err, residency.ErrLeaseHeld) {
		t.Fatalf("before the release owed: %v, want ErrLeaseHeld (the lost answer's grant)", err)
	}
	if err := owed.Release(ctx); err != nil {
		t.Fatalf("release owed: %v", err)
	}
	g, err := direct.AcquireSessionLease(ctx, key, "node-1")
	if err != nil || g.Epoch != 2 {
		t.Fatalf("acquire after the release owed: %+v, %v; want the lease free at epoch 2", g, err)
	}
	// Giving back again finds the lease another grant's: nothing owed.
	if err := owed.Release(ctx); err != nil {
		t.Fatalf("second release owed: %v", err)
	}
	if _, err := direct.RenewSessionLease(ctx, g); err != nil {
		t.Fatalf("the new grant after a second give-back: %v", err)
	}

	// A refusal the service names grants nothing and owes nothing.
	other := residency.Key{Tenant: tenant, Session: "never-placed"}
	if _, err := lossy.AcquireSessionLease(ctx, other, "node-1"); !errors.Is(err, residency.ErrNotPlaced) || errors.As(err, &owed) {
		t.Fatalf("refused acquire: %v, want ErrNotPlaced and nothing owed", err)
	}
}
