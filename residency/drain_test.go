package residency

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

// TestManager_DrainReleasesAll (library level; the end-to-end acceptance
// test is e2e.TestAcceptance_DrainReleasesAll): Drain stops admissions at once (the one
// ledger refuses, and published observations stop advertising accepting),
// cancels an attach admitted but not yet committed, releases every resident session
// gracefully, and reports the one whose runtime refused to go — still
// resident, not accepting. A second drain releases it once it can go, and
// another host resumes a drained session.
func TestManager_DrainReleasesAll(t *testing.T) {
	start := time.Now()
	env := newBus(t)
	ct := newContainerd(t)
	cp := newControlPlane(t, env, SystemClock{}, 3*time.Second, 3*time.Second) // a lease a loaded containerd launch fits in
	ctx := testCtx(t)
	durable := newMemDurable()
	rlog := watchResidency(t, env)
	rec := &recorder{}
	a := newHost(t, hostConfig{id: "host-a", cp: cp, env: env, durable: durable, runtime: ct.rt, target: ct.target, handler: rec.handler("host-a")})
	b := newHost(t, hostConfig{id: "host-b", cp: cp, env: env, durable: durable, runtime: ct.rt, target: ct.target, handler: rec.handler("host-b")})

	keys := []Key{{tenant, "d1"}, {tenant, "d2"}, {tenant, "d3"}}
	for _, k := range keys {
		durable.seed(k, compatA)
		if _, err := a.mgr.Attach(ctx, request(k, ModeResume)); err != nil {
			t.Fatal(err)
		}
	}
	stuck := keys[2]
	a.faults.inject("runtime.stop:" + WorkloadID(stuck, 1))

	// An attach admitted before the drain, held in its launch.
	late := Key{tenant, "d4"}
	durable.seed(late, compatA)
	gate, atGate := make(chan struct{}), make(chan struct{}, 1)
	a.faults.mu.Lock()
	a.faults.launchGate, a.faults.atGate = gate, atGate
	a.faults.mu.Unlock()
	type result struct {
		r   Residency
		err error
	}
	lateDone := make(chan result, 1)
	go func() {
		r, err := a.mgr.Attach(ctx, request(late, ModeResume))
		lateDone <- result{r, err}
	}()
	select {
	case <-atGate:
	case <-time.After(30 * time.Second):
		t.Fatal("the late attach never reached its launch")
	}

	type drained struct {
		rep DrainReport
		err error
	}
	drainDone := make(chan drained, 1)
	go func() {
		rep, err := a.mgr.Drain(ctx)
		drainDone <- drained{rep, err}
	}()
	waitFor(t, "the drain to begin", 30*time.Second, a.ledger.Draining)
	// New admissions are refused at once and take nothing.
	refused := Key{tenant, "d5"}
	durable.seed(refused, compatA)
	_, err := a.mgr.Attach(ctx, request(refused, ModeResume))
	var ae *AttachError
	if !errors.As(err, &ae) || ae.Code != CodeDraining || ae.Step != StepAdmit || !ae.TookNothing() {
		t.Fatalf("attach while draining: %v", err)
	}
	if got := held(t, cp, a, refused, nil); len(got) != 0 {
		t.Fatalf("refused attach held %v", got)
	}
	// The attach held in its launch had not committed: the drain cancels
	// it, and its compensations give back all it took.
	var lr result
	select {
	case lr = <-lateDone:
	case <-time.After(30 * time.Second):
		t.Fatal("the drain did not cancel the attach held in its launch")
	}
	if !errors.As(lr.err, &ae) || ae.Code != CodeDraining || ae.Step != StepLaunch || !ae.TookNothing() || !errors.Is(lr.err, ErrDraining) {
		t.Fatalf("attach in flight when the drain began: %+v %v; want cancelled at launch (draining), nothing held", lr.r, lr.err)
	}
	if got := held(t, cp, a, late, nil); len(got) != 0 {
		t.Fatalf("cancelled attach held %v", got)
	}
	a.faults.mu.Lock()
	a.faults.launchGate = nil
	a.faults.mu.Unlock()
	close(gate)

	var d drained
	select {
	case d = <-drainDone:
	case <-time.After(2 * time.Minute):
		t.Fatal("drain did not finish")
	}
	if !errors.Is(d.err, ErrDrainIncomplete) {
		t.Fatalf("drain error %v; want ErrDrainIncomplete", d.err)
	}
	wantReleased := []Key{keys[0], keys[1]}
	sortKeys(wantReleased)
	if !slices.Equal(d.rep.Released, wantReleased) || len(d.rep.Failures) != 1 {
		t.Fatalf("report %+v; want released %v and one failure", d.rep, wantReleased)
	}
	f := d.rep.Failures[0]
	if f.Key != stuck || !f.Aborted || !errors.Is(f, ErrReleaseAborted) || !errors.Is(f, errInjected) {
		t.Fatalf("failure %+v", f)
	}
	for _, k := range wantReleased {
		if got := held(t, cp, a, k, nil); len(got) != 0 {
			t.Fatalf("%s still held after drain: %v", k, got)
		}
	}
	// The stuck one is resident, and its route no longer advertises accepting.
	if r, ok := a.mgr.Resident(stuck); !ok || r.Phase != PhaseResident {
		t.Fatalf("stuck session %+v %v", r, ok)
	}
	obs, _, err := cp.locations.Get(ctx, stuck)
	if err != nil || obs.State != StateResident || obs.Accepting {
		t.Fatalf("stuck route %+v %v; want resident, not accepting", obs, err)
	}
	if ws := ct.workloads(t); !slices.Equal(ws, []string{WorkloadID(stuck, 1)}) {
		t.Fatalf("workloads %v", ws)
	}

	// Once the runtime can go, a second drain finishes.
	a.faults.clear()
	rep, err := a.mgr.Drain(ctx)
	if err != nil || !slices.Equal(rep.Released, []Key{stuck}) {
		t.Fatalf("second drain %+v %v", rep, err)
	}
	if a.ledger.InUse() != 0 || len(a.mgr.Residencies()) != 0 || len(ct.workloads(t)) != 0 {
		t.Fatalf("after drain: %d charged, %d residencies, workloads %v", a.ledger.InUse(), len(a.mgr.Residencies()), ct.workloads(t))
	}

	// Another host resumes a drained session at the next epoch.
	r, err := b.mgr.Attach(ctx, request(keys[0], ModeResume))
	if err != nil || r.Epoch != 2 {
		t.Fatalf("resume on B: %+v %v", r, err)
	}
	if err := publishWork(ctx, env.js, keys[0], "after-drain"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "B handling work", 30*time.Second, func() bool { return len(rec.snapshot()) == 1 })
	if err := rec.checkOnce([]string{"after-drain"}); err != nil {
		t.Fatal(err)
	}
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := b.mgr.Drain(dctx); err != nil {
		t.Fatal(err)
	}
	for _, k := range append(keys, late) {
		if err := rlog.check(k); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("total %v", time.Since(start))
}
