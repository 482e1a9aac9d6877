package e2e

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// decision returns the last booking decision recorded for a Run.
func (f *fleet) decision(runID string) *schemas.BookingDecision {
	f.t.Helper()
	var d *schemas.BookingDecision
	for _, ev := range f.events(runID) {
		if ev.Decision != nil {
			d = ev.Decision
		}
	}
	if d == nil {
		f.t.Fatalf("run %s has no decision", runID)
	}
	return d
}

func candidate(d *schemas.BookingDecision, node string) schemas.Candidate {
	for _, c := range d.Candidates {
		if c.NodeID == node {
			return c
		}
	}
	return schemas.Candidate{}
}

// TestAcceptance_WarmNodeWins: two agents on two containerds; the one that
// already holds the image's layers gets the Run, and the decision says why:
// the cold node would have had to pull the image's bytes.
func TestAcceptance_WarmNodeWins(t *testing.T) {
	wa, wb := newWorld(t), newWorld(t)
	f := newFleet(t)
	f.startAgent(agentSpec{id: "node-warm", world: wa})
	first := f.submit(schemas.RunRequest{RequestID: "warm-up", Image: wa.image.Reference, Command: []string{"true"}})
	f.waitPhase(first, schemas.PhaseSucceeded, 60*time.Second)
	// The warm node's facts now list the image hot.
	f.waitImageHot("node-warm", wa.image.ManifestDigest, 30*time.Second)
	f.startAgent(agentSpec{id: "node-cold", world: wb})

	id := f.submit(schemas.RunRequest{RequestID: "goes-warm", Image: wa.image.Reference, Command: []string{"true"}})
	done := f.waitPhase(id, schemas.PhaseSucceeded, 60*time.Second)
	if done.NodeID != "node-warm" {
		t.Fatalf("ran on %s, want node-warm", done.NodeID)
	}
	d := f.decision(id)
	warm, cold := candidate(d, "node-warm"), candidate(d, "node-cold")
	if d.Winner != "node-warm" || warm.Components.ImageState != string(schemas.LocalityHot) || warm.Components.PullBytes != 0 {
		t.Fatalf("winner %s, warm candidate %+v", d.Winner, warm)
	}
	if !cold.Eligible || cold.Reason != schemas.ReasonOutscored || cold.Components.PullBytes == 0 || cold.Cost <= warm.Cost {
		t.Fatalf("cold candidate should be eligible, outscored, with bytes to pull: %+v", cold)
	}
}

// TestAcceptance_GPURunOnGPULessFleet: on this machine the agent finds no
// GPU driver; a Run that needs a GPU is refused at once with a reason per
// node, instead of waiting forever.
func TestAcceptance_GPURunOnGPULessFleet(t *testing.T) {
	w := newWorld(t)
	f := newFleet(t)
	f.startAgent(agentSpec{id: "cpu-only", world: w})
	id := f.submit(schemas.RunRequest{RequestID: "needs-gpu", Image: w.image.Reference, Command: []string{"nvidia-smi"},
		Resources: schemas.Resources{GPUCount: 1}})
	r := f.waitPhase(id, schemas.PhaseFailed, 30*time.Second)
	if r.Reason != string(schemas.CodeUnsatisfiable) {
		t.Fatalf("reason %q, want %s", r.Reason, schemas.CodeUnsatisfiable)
	}
	if c := candidate(f.decision(id), "cpu-only"); c.Reason != schemas.ReasonInsufficientGPU {
		t.Fatalf("cpu-only rejected for %q (%s), want %s", c.Reason, c.Detail, schemas.ReasonInsufficientGPU)
	}
}

// TestAcceptance_DrainedNodeGetsNoRuns: `warmfleet node drain` (its admin
// request) stops placement on a node at once; the decision says so.
func TestAcceptance_DrainedNodeGetsNoRuns(t *testing.T) {
	wa, wb := newWorld(t), newWorld(t)
	f := newFleet(t)
	f.startAgent(agentSpec{id: "node-a", world: wa})
	f.startAgent(agentSpec{id: "node-b", world: wb})
	body, _ := json.Marshal(schemas.AdminRequest{ID: "node-a"})
	resp, err := f.conn.NC.Request(bus.SubjectDrain, body, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var rep schemas.Reply[schemas.NodeRecord]
	if err := json.Unmarshal(resp.Data, &rep); err != nil || rep.OK == nil || rep.OK.State != schemas.NodeDraining {
		t.Fatalf("drain reply: %v %+v", err, rep.Refusal)
	}
	for i := range 3 {
		id := f.submit(schemas.RunRequest{RequestID: fmt.Sprintf("after-drain-%d", i), Image: wa.image.Reference, Command: []string{"true"}})
		r := f.waitPhase(id, schemas.PhaseSucceeded, 60*time.Second)
		if r.NodeID != "node-b" {
			t.Fatalf("run went to drained %s", r.NodeID)
		}
		if c := candidate(f.decision(id), "node-a"); c.Reason != schemas.ReasonNodeDraining {
			t.Fatalf("node-a rejected for %q, want node_draining", c.Reason)
		}
	}
	// Draining an unknown node is refused with its code.
	body, _ = json.Marshal(schemas.AdminRequest{ID: "nope"})
	resp, err = f.conn.NC.Request(bus.SubjectDrain, body, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	rep = schemas.Reply[schemas.NodeRecord]{}
	if err := json.Unmarshal(resp.Data, &rep); err != nil || rep.Refusal == nil || rep.Refusal.Code != schemas.CodeUnknownNode {
		t.Fatalf("drain of an unknown node: %v %+v", err, rep)
	}
}
