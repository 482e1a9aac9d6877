package controlplane_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestNodeLeasesAnswerLiveLease: wf_nodes keeps the lease written at the
// last state change, while wf.admin.node.leases answers with the one the
// node's heartbeats have earned since; an unknown node is refused by name.
func TestNodeLeasesAnswerLiveLease(t *testing.T) {
	const hb = 200 * time.Millisecond
	pl := startTestPlane(t, controlplane.Config{HeartbeatInterval: hb, LeaseMultiplier: 3, ReconcileInterval: 50 * time.Millisecond, WaitForCapacity: true, OpenEnrollment: true})
	enr := pl.enroll(t, "n1")
	stored, _ := pl.node(t, "n1")
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(hb / 2) {
		pl.heartbeat(t, "n1", enr.FencingToken)
	}
	ask := func(body []byte) schemas.Reply[[]schemas.NodeLease] {
		t.Helper()
		resp, err := pl.conn.NC.Request(bus.SubjectNodeLeases, body, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var rep schemas.Reply[[]schemas.NodeLease]
		if err := json.Unmarshal(resp.Data, &rep); err != nil {
			t.Fatalf("reply %q: %v", resp.Data, err)
		}
		return rep
	}
	var live schemas.NodeLease
	eventually(t, 5*time.Second, "a live lease past the stored one", func() bool {
		rep := ask(nil)
		if rep.OK == nil || len(*rep.OK) != 1 {
			return false
		}
		live = (*rep.OK)[0]
		return live.LeaseExpires.After(stored.LeaseExpires.Add(hb))
	})
	if live.NodeID != "n1" || live.FencingToken != enr.FencingToken || live.State != schemas.NodeReady {
		t.Fatalf("live lease %+v", live)
	}
	if now, _ := pl.node(t, "n1"); !now.LeaseExpires.Equal(stored.LeaseExpires) {
		t.Fatalf("heartbeats wrote the lease to wf_nodes: %s → %s", stored.LeaseExpires, now.LeaseExpires)
	}
	if rep := ask([]byte(`{"id":"n1"}`)); rep.OK == nil || len(*rep.OK) != 1 {
		t.Fatalf("one node's lease: %+v", rep)
	}
	if rep := ask([]byte(`{"id":"nope"}`)); rep.Refusal == nil || rep.Refusal.Code != schemas.CodeUnknownNode || rep.Refusal.Field != "id" {
		t.Fatalf("unknown node: %+v", rep)
	}
	if rep := ask([]byte(`{"id":`)); rep.Refusal == nil {
		t.Fatalf("malformed request answered %+v", rep)
	}
}
