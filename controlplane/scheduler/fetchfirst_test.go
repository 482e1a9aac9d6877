package scheduler

import (
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/lifecycle"
	"github.com/warmfleet/warmfleet/controlplane/runs"
	"github.com/warmfleet/warmfleet/schemas"
)

// coldImage is an image no test node holds.
const coldImage = "registry.example/cold@sha256:b172cedcae47474b615c54d510a5d84a8dea3032e958587430b413538be3f333"

// submitImage creates a Run of ref asking for cpu millicores and at most
// maxRuntime seconds (0: none).
func (e *env) submitImage(requestID, ref string, cpu, maxRuntime int64) schemas.Run {
	e.t.Helper()
	r, _, err := e.store.Create(e.ctx, schemas.DefaultTenant, bus.OperatorUser, schemas.RunRequest{RequestID: requestID, Image: ref,
		Resources: schemas.Resources{CPUMillis: cpu}, MaxRuntimeSeconds: maxRuntime}, nil, runs.Policy{}, func(schemas.Run) lifecycle.Transition { return nil })
	if err != nil {
		e.t.Fatal(err)
	}
	e.now = e.now.Add(time.Second) // the next Run is younger
	return r
}

// report applies a workload observation of r's current attempt on its node.
func (e *env) report(r schemas.Run, phase schemas.WorkloadPhase) {
	e.t.Helper()
	zero := 0
	w := schemas.WorkloadObservation{RunID: r.ID, AttemptID: r.AttemptID, Phase: phase, ObservedAt: e.now}
	if phase == schemas.WorkloadExited {
		w.ExitCode = &zero
	}
	if _, err := e.store.Advance(e.ctx, r.ID, lifecycle.Report{NodeID: r.NodeID, Workload: w}, false); err != nil {
		e.t.Fatal(err)
	}
}

// A Run whose image its node lacks is booked there to fetch it first: it
// holds no place until the node reports it prepared, and only its
// preparation is sent. Meanwhile a Run that fits beside it starts there;
// once its bytes are there it starts from the queue.
func TestPassFetchFirst(t *testing.T) {
	e := newEnv(t, false, nil)
	e.node("n1", 2000) // holds image, not coldImage
	cold := e.submitImage("cold", coldImage, 1000, 0)
	sent := e.sched.dispatch.Sent()
	e.pass()
	got := e.run(cold.ID)
	if got.NodeID != "n1" || !got.Queued || !got.AwaitsBytes || got.ReadyBy == nil || !got.ReadyBy.After(e.now) {
		t.Fatalf("cold Run: node %q queued %v awaits bytes %v ready by %v; want booked on n1 to fetch first", got.NodeID, got.Queued, got.AwaitsBytes, got.ReadyBy)
	}
	if d := decisionOf(t, got); !d.FetchFirst || d.WinnerQueued {
		t.Errorf("decision: fetch first %v, winner queued %v; want fetch first on a free node", d.FetchFirst, d.WinnerQueued)
	}
	if n := e.sched.dispatch.Sent() - sent; n != 1 {
		t.Errorf("%d commands sent, want the image's preparation alone", n)
	}
	if h := got.Attempts[len(got.Attempts)-1].HeldFrom; h != nil {
		t.Errorf("the attempt holds its place from %v before its bytes are there", h)
	}

	warm := e.submitImage("warm", image, 1000, 0)
	e.pass()
	if w := e.run(warm.ID); w.NodeID != "n1" || w.Queued {
		t.Fatalf("warm Run: node %q queued %v; want started beside the fetch", w.NodeID, w.Queued)
	}
	if e.run(cold.ID).Queued != true {
		t.Fatal("the cold Run left the queue before its bytes were there")
	}

	e.report(got, schemas.WorkloadPrepared)
	if r := e.run(cold.ID); r.Phase != schemas.PhaseLaunching || !r.Queued {
		t.Fatalf("prepared: %s queued %v; want launching, still queued", r.Phase, r.Queued)
	}
	sent = e.sched.dispatch.Sent()
	e.pass()
	if r := e.run(cold.ID); r.Queued || r.Attempts[len(r.Attempts)-1].HeldFrom == nil {
		t.Fatalf("bytes there and room: queued %v; want started, holding its place from now", r.Queued)
	}
	if n := e.sched.dispatch.Sent() - sent; n != 2 {
		t.Errorf("%d commands sent at the start, want the preparation again (applied once) and the launch", n)
	}
}

// A Run that could start now on the place a fetch counts on pays the wait
// it would cause: it goes elsewhere when it can, and when it cannot it
// starts there and the fetched Run waits for it.
func TestPassFetchFirstDisplacement(t *testing.T) {
	t.Run("another node", func(t *testing.T) {
		e := newEnv(t, false, nil)
		e.node("n1", 1000)
		cold := e.submitImage("cold", coldImage, 1000, 0)
		e.pass()
		e.coldNode("n2", 1000)
		warm := e.submitImage("warm", image, 1000, 0) // holds its place 10 minutes: dearer than a pull on n2
		e.pass()
		if w := e.run(warm.ID); w.NodeID != "n2" {
			t.Fatalf("warm Run booked on %q, want n2: taking the place n1's fetch counts on costs more than fetching on n2", w.NodeID)
		}
		if d := decisionOf(t, e.run(warm.ID)); candidateOf(t, d, "n1").Components.DisplaceSeconds != 600 {
			t.Errorf("n1's displacement price %v, want 600 s", candidateOf(t, d, "n1").Components)
		}
		if c := e.run(cold.ID); c.NodeID != "n1" || !c.Queued {
			t.Errorf("the fetching Run moved: %q queued %v", c.NodeID, c.Queued)
		}
	})
	t.Run("the only node", func(t *testing.T) {
		e := newEnv(t, false, nil)
		e.node("n1", 1000)
		cold := e.submitImage("cold", coldImage, 1000, 0)
		e.pass()
		warm := e.submitImage("warm", image, 1000, 30)
		e.pass()
		if w := e.run(warm.ID); w.NodeID != "n1" || w.Queued {
			t.Fatalf("warm Run: %q queued %v; want started on n1 (30 s of displacement beats waiting)", w.NodeID, w.Queued)
		}
		e.report(e.run(cold.ID), schemas.WorkloadPrepared)
		e.pass()
		if !e.run(cold.ID).Queued {
			t.Fatal("the fetched Run started while the warm one holds the place")
		}
		e.report(e.run(warm.ID), schemas.WorkloadExited)
		e.pass()
		if c := e.run(cold.ID); c.Queued {
			t.Fatal("the fetched Run did not start once the place freed")
		}
	})
}

// coldNode enrolls a ready node offering cpu millicores and holding no
// image.
func (e *env) coldNode(id string, cpu int64) {
	e.cache.NoteNode(schemas.NodeRecord{NodeID: id, State: schemas.NodeReady, FencingToken: 1, Generation: 1,
		Capacity: schemas.Resources{CPUMillis: cpu, MemoryBytes: 1 << 30}, LeaseExpires: e.now.Add(time.Hour),
		Facts: &schemas.NodeFacts{Host: schemas.HostFacts{OS: "linux", Architecture: "amd64"}}, FactsReceivedAt: e.now}, 1)
}

// decisionOf is the decision r's current attempt was booked by.
func decisionOf(t *testing.T, r schemas.Run) schemas.BookingDecision {
	t.Helper()
	for _, ev := range r.Outbox {
		if ev.Decision != nil {
			return *ev.Decision
		}
	}
	t.Fatalf("run %s: no decision in its last change", r.ID)
	return schemas.BookingDecision{}
}

func candidateOf(t *testing.T, d schemas.BookingDecision, node string) schemas.Candidate {
	t.Helper()
	for _, c := range d.Candidates {
		if c.NodeID == node {
			return c
		}
	}
	t.Fatalf("no candidate %s", node)
	return schemas.Candidate{}
}
