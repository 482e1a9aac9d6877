package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/adapters/capacity/ephemeral"
	"github.com/warmfleet/warmfleet/adapters/capacity/ephemeral/fakeexec"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/controlplane/lane"
	"github.com/warmfleet/warmfleet/schemas"
)

const laneImage = "registry.example/worker@sha256:3333333333333333333333333333333333333333333333333333333333333333"

// TestAcceptance_EphemeralLane: with no node and no rental, a Run that
// allows the ephemeral lane is booked there (its decision names the lane,
// locality unknown), executes on the fake standing pool, and ends like any
// Run: succeeded, its output stored, its attempt costed. A Run that does
// not allow the lane never goes there. A launch whose answer is lost is
// found again by its launch key through ListOwned, with no second
// execution. A Run cancelled while its execution is queued has that
// execution cancelled before it ever runs; one whose start deadline
// passes while it is queued fails deadline_exceeded, its execution
// cancelled too; one that runs past its max runtime on a pool that does
// not enforce it is released by the lane and fails max_runtime. The lane's
// connection is shown
// with the provider connections, verified.
func TestAcceptance_EphemeralLane(t *testing.T) {
	// A pool that does not enforce the execution timeout, so the lane's own
	// stop past a Run's max runtime is what ends a hung execution.
	exec := fakeexec.New(fakeexec.Config{QueueFor: 100 * time.Millisecond, RunFor: 700 * time.Millisecond, IgnoreTimeout: true,
		Offers: []ephemeral.Offer{{Image: laneImage, MaxRuntimeSeconds: 3600, Offer: capacity.Offer{ID: "pool-a100", Provider: fakeexec.Type,
			GPUModel: "A100", GPUCount: 1, CPUMillis: 8000, MemoryBytes: 32 << 30, Available: true, ReadySeconds: 2,
			PricePerHour: capacity.Price{Currency: "USD", MicrosPerHour: 3_600_000, Exact: true}}}}})
	f := newFleet(t, invitedOnly, func(c *controlplane.Config) {
		c.WaitForCapacity, c.MaxRuntimeSlack = true, 500*time.Millisecond
		c.Lane = &lane.Config{Connections: []lane.Connection{{ID: "pool", Executor: exec, OwnershipToken: "wf-e2e"}},
			Interval: 100 * time.Millisecond, LostAnswerAfter: time.Second}
	})
	laneNode := schemas.LaneNodeID("pool")
	req := func(id string, ephemeralOK bool) schemas.RunRequest {
		return schemas.RunRequest{RequestID: id, Image: laneImage, Command: []string{"python", "train.py"}, Args: []string{"--epochs", "1"},
			MaxRuntimeSeconds: 600, Ephemeral: ephemeralOK}
	}

	nodeOnly := f.submit(req("node-only", false))
	first := f.submit(req("lane-1", true))
	r := f.waitPhase(first, schemas.PhaseSucceeded, 30*time.Second)
	if r.NodeID != laneNode || r.Execution == nil || r.Execution.ExecutionID == "" || r.Execution.OfferID != "pool-a100" {
		t.Fatalf("run on %s, execution %+v; want the lane", r.NodeID, r.Execution)
	}
	if len(r.Attempts) != 1 || r.Attempts[0].NodeID != laneNode || r.Attempts[0].CostUSD <= 0 || r.CostUSD <= 0 {
		t.Fatalf("attempts %+v, cost %v: want one lane attempt, costed", r.Attempts, r.CostUSD)
	}
	if out := f.stdout(first); !strings.Contains(out, "python train.py --epochs 1") {
		t.Fatalf("stored output %q; want what the execution returned", out)
	}
	if cs := f.connections(); len(cs) != 1 || cs[0].ID != "pool" || !cs[0].Lane || cs[0].State != schemas.ConnectionOK || cs[0].Type != fakeexec.Type {
		t.Fatalf("connections %+v; want the lane's one, verified", cs)
	}
	decided := false
	for _, ev := range f.events(first) {
		if d := ev.Decision; ev.Decided() && d != nil && d.Winner == laneNode {
			for _, c := range d.Candidates {
				decided = decided || c.NodeID == laneNode && c.Components.ImageState == string(schemas.LocalityUnknown) && strings.Contains(c.Detail, "ephemeral lane")
			}
		}
	}
	if !decided {
		t.Error("no decision names the lane as the winner, its locality unknown")
	}
	if nr, _ := f.run(nodeOnly); nr.Phase != schemas.PhaseAccepted || nr.NodeID != "" || exec.Launches() != 1 {
		t.Fatalf("the Run that does not allow the lane is %s on %q after %d launches", nr.Phase, nr.NodeID, exec.Launches())
	}

	// A launch whose answer is lost is found by its launch key.
	exec.LoseNextLaunch(1)
	lost := f.submit(req("lane-lost", true))
	lr := f.waitPhase(lost, schemas.PhaseSucceeded, 30*time.Second)
	if exec.Launches() != 2 || lr.Attempt != 1 {
		t.Fatalf("%d launches, attempt %d; want the lost one found, not launched again", exec.Launches(), lr.Attempt)
	}
	found := false
	for _, ev := range f.events(lost) {
		found = found || ev.Type == schemas.EventNote && strings.Contains(ev.Message, "execution "+lr.Execution.ExecutionID)
	}
	if !found {
		t.Error("no event records the execution found again")
	}

	// A cancel of a queued execution: it never runs.
	exec.Hold(true)
	queued := f.submit(req("lane-cancel", true))
	var qr schemas.Run
	f.eventually(20*time.Second, "the execution to be queued", func() bool {
		qr, _ = f.run(queued)
		return qr.Execution != nil && qr.Execution.ExecutionID != ""
	})
	f.publish(bus.CancelSubject(schemas.DefaultTenant, bus.OperatorUser), []byte(`{"run_id":"`+queued+`","reason":"not needed"}`), "")
	f.waitPhase(queued, schemas.PhaseCancelled, 20*time.Second)
	if st := exec.Executions()[qr.Execution.ExecutionID]; st != ephemeral.StateCancelled {
		t.Fatalf("the cancelled Run's execution is %s; want cancelled before it ran", st)
	}

	// A start deadline passed while the execution waits in the provider's
	// queue: the Run fails deadline_exceeded and its execution is released.
	late := req("lane-deadline", true)
	late.StartDeadlineSeconds = 2
	lateID := f.submit(late)
	dr := f.waitPhase(lateID, schemas.PhaseFailed, 20*time.Second)
	exec.Hold(false)
	if dr.Reason != string(schemas.CodeDeadlineExceeded) || dr.Execution == nil || exec.Executions()[dr.Execution.ExecutionID] != ephemeral.StateCancelled {
		t.Fatalf("past its start deadline: reason %q, execution %+v; want deadline_exceeded and the execution cancelled", dr.Reason, dr.Execution)
	}
	// Past its max runtime (and the slack) on a pool that does not stop
	// it: the lane releases the execution and the Run ends as a timeout.
	hung := req("lane-overdue", true)
	hung.Command, hung.MaxRuntimeSeconds = []string{"hang"}, 1
	hungID := f.submit(hung)
	hr := f.waitPhase(hungID, schemas.PhaseFailed, 20*time.Second)
	if hr.Reason != string(schemas.CodeMaxRuntime) || hr.Execution == nil || exec.Executions()[hr.Execution.ExecutionID] != ephemeral.StateCancelled {
		t.Fatalf("past its max runtime: reason %q, execution %+v; want max_runtime and the execution released", hr.Reason, hr.Execution)
	}
	f.publish(bus.CancelSubject(schemas.DefaultTenant, bus.OperatorUser), []byte(`{"run_id":"`+nodeOnly+`"}`), "")
	f.waitPhase(nodeOnly, schemas.PhaseCancelled, 10*time.Second)
}
