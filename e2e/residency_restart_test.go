package e2e

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/internal/noopruntime"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/residency"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestResidency_RestartsKeepAndCleanRuntimes: a control-plane restart asks
// every node to reconcile; a resident session's runtime is the session
// host's, not a Run's, so it is neither reported nor stopped, and the session
// keeps serving its inbox. An agent restart drops the process's grants: the
// new process removes the runtimes the old one left behind, and the session
// resumes (here on the same node) under the next epoch.
func TestResidency_RestartsKeepAndCleanRuntimes(t *testing.T) {
	f := sessionFleet(t)
	l := newLedger(t)
	rt := noopruntime.New(noopruntime.Options{})
	a := f.startSessionNode(sessionNodeSpec{id: "node-a", rt: rt, ledger: l})
	key := residency.Key{Tenant: "acme", Session: "keep-1"}
	r := f.attachSession(schemas.SessionRequest{Tenant: key.Tenant, Session: key.Session, Node: a.id})
	ctx := context.Background()

	// The new control plane asks node-a to reconcile: wait for that round
	// trip (node-a's account published and handled) and for any command
	// sent in answer to be applied, before looking at the runtime.
	obs := f.watchObservations(a.id)
	f.cp.stop(t)
	f.cp = f.startCP()
	f.eventually(30*time.Second, "node-a's reconciliation after the restart", func() bool {
		return obs.has(func(o schemas.Observation) bool { return o.Kind == schemas.ObsReconciliation })
	})
	f.waitHandled(bus.StreamObs, bus.NodeObs(a.id), 30*time.Second)
	f.waitHandled(bus.StreamCmds, bus.NodeCmd(a.id), 30*time.Second)
	if st, err := rt.Inspect(ctx, r.Workload); err != nil || st.State != noderuntime.WorkloadRunning {
		t.Fatalf("session runtime after control-plane restart: %+v, %v", st, err)
	}
	f.publishWork(key, "k-1")
	f.eventually(10*time.Second, "work handled after control-plane restart", func() bool { return len(l.handled("k-1")) == 1 })
	if o, _ := f.route(key); o.State != residency.StateResident || o.Epoch != 1 {
		t.Fatalf("route after control-plane restart: %+v", o)
	}

	// The agent process goes; a new one for the same node starts on the
	// same runtime.
	a.part.stop(t)
	a2 := f.startSessionNode(sessionNodeSpec{id: "node-a", rt: rt, ledger: l})
	f.eventually(10*time.Second, "leftover session runtime removed", func() bool {
		_, err := rt.Inspect(ctx, r.Workload)
		return errors.Is(err, noderuntime.ErrWorkloadNotFound)
	})
	var r2 schemas.ResidencyView
	f.eventually(20*time.Second, "session resumed after the old lease expired", func() bool {
		rep := f.sessionAdmin("wf.admin.session.attach", schemas.SessionRequest{Tenant: key.Tenant, Session: key.Session, Node: a2.id})
		if rep.Error != nil {
			time.Sleep(250 * time.Millisecond)
			return false
		}
		r2 = *rep.Residency
		return true
	})
	if r2.Epoch != 2 {
		t.Fatalf("resume after agent restart: %+v, want epoch 2", r2)
	}
	if st, err := rt.Inspect(ctx, r2.Workload); err != nil || st.State != noderuntime.WorkloadRunning {
		t.Fatalf("resumed runtime: %+v, %v", st, err)
	}
	l.checkNoOverlap()
}
