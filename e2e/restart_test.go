package e2e

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/schemas"
)

// receipts returns (applied first-time, duplicates) receipts for an operation.
func (o *observations) receipts(op string) (applied, dups int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, ob := range o.all {
		rc := ob.Receipt
		if rc == nil || rc.OperationID != op || rc.Outcome != schemas.OutcomeApplied {
			continue
		}
		if rc.Duplicate {
			dups++
		} else {
			applied++
		}
	}
	return
}

// resend publishes a command again as a control plane resending after its
// dedupe window would: same operation id, a fresh Nats-Msg-Id.
func (f *fleet) resend(c schemas.Command, n int) {
	f.t.Helper()
	b, err := codec.Encode(codec.MsgPack, c)
	if err != nil {
		f.t.Fatal(err)
	}
	for i := range n {
		m := &nats.Msg{Subject: bus.NodeCmd(c.NodeID), Data: b}
		if _, err := f.conn.JS.PublishMsg(context.Background(), m, jetstream.WithMsgID("test-resend:"+c.OperationID+":"+strconv.Itoa(i))); err != nil {
			f.t.Fatal(err)
		}
	}
}

// TestAcceptance_DuplicateCommandsOneEffect: every command type, sent three
// times and redelivered by JetStream after an agent crash before its ack,
// has one effect: one pull, one container, one stop.
func TestAcceptance_DuplicateCommandsOneEffect(t *testing.T) {
	w := newWorld(t)
	f := newFleet(t)
	c := &counts{}
	dir := tempDir(t)
	var once sync.Once
	crashed := make(chan struct{})
	faults := &agent.Faults{LeaveUnacked: func(cmd schemas.Command) bool {
		hit := false
		if cmd.Kind == schemas.CmdLaunchWorkload {
			once.Do(func() { hit = true; close(crashed) })
		}
		return hit
	}}
	rc := f.watchObservations("n1")
	a := f.startAgent(agentSpec{id: "n1", world: w, dataDir: dir, counts: c, faults: faults})
	// The workload outlives the agent restart and the resends however slow
	// they are; the cancel ends it.
	id := f.submit(schemas.RunRequest{RequestID: "dup", Image: w.image.Reference, Command: []string{"sleep", "300"}})
	<-crashed
	r := f.waitPhase(id, schemas.PhaseRunning, 60*time.Second)
	// The agent dies with the launch unacked; its next process gets it again.
	a.part.stop(t)
	f.startAgent(agentSpec{id: "n1", world: w, dataDir: dir, counts: c})
	enr := f.nodeRecord("n1")

	cmd := func(op string, kind schemas.CommandKind) schemas.Command {
		return schemas.Command{OperationID: op, NodeID: "n1", FencingToken: enr.FencingToken, Generation: enr.Generation, Kind: kind, IssuedAt: time.Now()}
	}
	ref, _ := schemas.ParseImageRef("image", w.image.Reference)
	prep := cmd(r.AttemptID+".prepare", schemas.CmdPrepareImage)
	prep.PrepareImage = &schemas.PrepareImage{RunID: id, AttemptID: r.AttemptID, Reference: ref.String(), ManifestDigest: ref.Digest, Unpack: true}
	launch := cmd(r.AttemptID+".launch", schemas.CmdLaunchWorkload)
	launch.Launch = &schemas.LaunchWorkload{RunID: id, AttemptID: r.AttemptID, Reference: ref.String(), ManifestDigest: ref.Digest, Command: []string{"sleep", "300"}}
	f.resend(prep, 2)
	f.resend(launch, 2)
	f.eventually(30*time.Second, "duplicate receipts for prepare and launch", func() bool {
		_, pd := rc.receipts(prep.OperationID)
		_, ld := rc.receipts(launch.OperationID)
		return pd >= 2 && ld >= 3 // launch: two resends plus the redelivery after the crash
	})

	f.publish(bus.CancelSubject(schemas.DefaultTenant, bus.OperatorUser), []byte(`{"run_id":"`+id+`","grace_seconds":1}`), "")
	f.waitPhase(id, schemas.PhaseCancelled, 30*time.Second)
	stop := cmd(r.AttemptID+".stop", schemas.CmdStopWorkload)
	stop.Stop = &schemas.StopWorkload{RunID: id, AttemptID: r.AttemptID, GraceSeconds: 1}
	f.resend(stop, 2)
	f.eventually(30*time.Second, "duplicate receipts for stop", func() bool {
		_, sd := rc.receipts(stop.OperationID)
		return sd >= 2
	})
	for _, op := range []string{prep.OperationID, launch.OperationID, stop.OperationID} {
		if applied, _ := rc.receipts(op); applied != 1 {
			t.Errorf("%s applied %d times, want once", op, applied)
		}
	}
	if c.pulled() != 1 || c.launched(r.AttemptID) != 1 || c.stopped(r.AttemptID) != 1 {
		t.Fatalf("effects: %d pulls, %d launches, %d stops; want one of each", c.pulled(), c.launched(r.AttemptID), c.stopped(r.AttemptID))
	}
}

// TestAcceptance_RestartReconciles: an agent killed mid-run, a control plane
// restarted mid-run, and a nats-server restarted with its file store each
// leave the Run to finish with its real exit code, on its one container.
func TestAcceptance_RestartReconciles(t *testing.T) {
	w := newWorld(t)
	f := newFleet(t)
	c := &counts{}
	dir := tempDir(t)
	a := f.startAgent(agentSpec{id: "n1", world: w, dataDir: dir, counts: c})

	t.Run("agent", func(t *testing.T) {
		id := f.submit(schemas.RunRequest{RequestID: "agent-restart", Image: w.image.Reference, Command: []string{"sh", "-c", "sleep 3; exit 7"}})
		r := f.waitPhase(id, schemas.PhaseRunning, 60*time.Second)
		a.part.stop(t) // the container keeps running in containerd
		a = f.startAgent(agentSpec{id: "n1", world: w, dataDir: dir, counts: c})
		if !a.agent.Enrollment().Duplicate {
			t.Errorf("restarted agent did not resume its node identity")
		}
		done := f.waitPhase(id, schemas.PhaseFailed, 60*time.Second)
		if done.ExitCode == nil || *done.ExitCode != 7 || c.launched(r.AttemptID) != 1 {
			t.Fatalf("exit %v, launches %d; want 7 and one container", done.ExitCode, c.launched(r.AttemptID))
		}
	})
	t.Run("control plane", func(t *testing.T) {
		obs := f.watchObservations("n1")
		id := f.submit(schemas.RunRequest{RequestID: "cp-restart", Image: w.image.Reference, Command: []string{"sh", "-c", "sleep 2; exit 5"}})
		r := f.waitPhase(id, schemas.PhaseRunning, 60*time.Second)
		f.cp.stop(t)
		// The workload exits while no control plane runs: its exit report
		// waits in WF_OBS.
		f.eventually(60*time.Second, "the workload's exit reported while the control plane is down", func() bool {
			return obs.has(func(o schemas.Observation) bool {
				return o.Workload != nil && o.Workload.AttemptID == r.AttemptID && o.Workload.Phase == schemas.WorkloadExited
			})
		})
		f.cp = f.startCP()
		done := f.waitPhase(id, schemas.PhaseFailed, 60*time.Second)
		if done.ExitCode == nil || *done.ExitCode != 5 || c.launched(r.AttemptID) != 1 {
			t.Fatalf("exit %v, launches %d; want 5 and one container", done.ExitCode, c.launched(r.AttemptID))
		}
	})
	t.Run("nats", func(t *testing.T) {
		id := f.submit(schemas.RunRequest{RequestID: "nats-restart", Image: w.image.Reference, Command: []string{"sh", "-c", "sleep 3; exit 0"}})
		r := f.waitPhase(id, schemas.PhaseRunning, 60*time.Second)
		f.nats.Restart(t)
		done := f.waitPhase(id, schemas.PhaseSucceeded, 90*time.Second)
		if *done.ExitCode != 0 || c.launched(r.AttemptID) != 1 {
			t.Fatalf("exit %v, launches %d", *done.ExitCode, c.launched(r.AttemptID))
		}
		// Intake still works after the restart.
		next := f.submit(schemas.RunRequest{RequestID: "after-nats-restart", Image: w.image.Reference, Command: []string{"true"}})
		f.waitPhase(next, schemas.PhaseSucceeded, 60*time.Second)
	})
}

// TestAcceptance_LostNodeRetriesElsewhere: a node that stops heartbeating
// loses its Run's attempt; the Run is retried on another node and finishes
// there, and the old attempt is stopped when its node comes back.
func TestAcceptance_LostNodeRetriesElsewhere(t *testing.T) {
	wa, wb := newWorld(t), newWorld(t)
	f := newFleet(t, func(c *controlplane.Config) { c.MaxAttempts = 2 })
	ca, cb := &counts{}, &counts{}
	dirA := tempDir(t)
	a := f.startAgent(agentSpec{id: "node-a", world: wa, dataDir: dirA, counts: ca})
	id := f.submit(schemas.RunRequest{RequestID: "lost", Image: wa.image.Reference, Command: []string{"sh", "-c", `if [ "$WARMFLEET_NODE_ID" = node-a ]; then sleep 120; else sleep 1; fi`}})
	first := f.waitPhase(id, schemas.PhaseRunning, 60*time.Second)
	f.startAgent(agentSpec{id: "node-b", world: wb, counts: cb})
	a.part.stop(t) // node-a goes silent; its container keeps running

	done := f.waitPhase(id, schemas.PhaseSucceeded, 90*time.Second)
	if done.NodeID != "node-b" || done.Attempt != 2 {
		t.Fatalf("finished on %s attempt %d; want node-b attempt 2", done.NodeID, done.Attempt)
	}
	var lost bool
	for _, ev := range f.events(id) {
		if ev.Code == schemas.CodeNodeLost && ev.Phase == schemas.PhaseAccepted {
			lost = true
		}
	}
	if !lost {
		t.Fatalf("no node_lost event in %v", phaseNames(f.events(id)))
	}
	// node-a comes back: the superseded attempt is stopped, not reported as the Run.
	f.startAgent(agentSpec{id: "node-a", world: wa, dataDir: dirA, counts: ca})
	f.eventually(30*time.Second, "old attempt stopped", func() bool { return ca.stopped(first.AttemptID) >= 1 })
	if r, _ := f.run(id); r.Phase != schemas.PhaseSucceeded || r.NodeID != "node-b" {
		t.Fatalf("the returning node changed the Run: %s on %s", r.Phase, r.NodeID)
	}
}
