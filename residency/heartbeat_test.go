package residency

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

func fakeTarget() RuntimeTarget {
	return RuntimeTarget{
		Image:          "localhost/fake@sha256:" + strings.Repeat("b", 64),
		ManifestDigest: "sha256:" + strings.Repeat("b", 64), CompatibilityID: compatA,
	}
}

// TestHeartbeatSurrendersOnLaterEpoch: a heartbeat whose republish is
// refused because a later epoch holds the route closes the grant's Lost
// (one fence, seen by all) and surrenders: consumption stops, the runtime
// goes, the charge is credited back, and nothing more is written.
func TestHeartbeatSurrendersOnLaterEpoch(t *testing.T) {
	env := newBus(t)
	cp := newControlPlane(t, env, SystemClock{}, 2*time.Second, 0)
	ctx := testCtx(t)
	key := Key{tenant, "superseded"}
	durable := newMemDurable()
	durable.seed(key, compatA)
	rt := newFakeRuntime()
	cons := newConsumption()
	lost := make(chan LostResidency, 1)
	h := newHost(t, hostConfig{
		id: "host-s", cp: cp, env: env, durable: durable, runtime: rt, target: fakeTarget(),
		handler: (&recorder{}).handler("host-s"), heartbeat: 30 * time.Millisecond,
		hooks: Hooks{OnLost: func(l LostResidency) { lost <- l }, OnConsume: cons.hook("host-s")},
	})
	r, err := h.mgr.Attach(ctx, request(key, ModeResume))
	if err != nil {
		t.Fatal(err)
	}
	fence := h.mgr.sessions[key].fenceOf()
	h.faults.injectErr("locations.publish.resident", ErrEpochSuperseded)
	var l LostResidency
	select {
	case l = <-lost:
	case <-time.After(5 * time.Second):
		t.Fatal("no surrender")
	}
	if !errors.Is(l.Reason, ErrEpochSuperseded) || l.Epoch != r.Epoch || l.Generation != r.Generation {
		t.Fatalf("lost %+v", l)
	}
	if err := fence.Check(); !errors.Is(err, ErrStaleEpoch) || !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("the shared fence still passes: %v", err)
	}
	if rt.count() != 0 || h.ledger.InUse() != 0 || len(cons.running(key)) != 0 {
		t.Fatalf("after surrender: %d workloads, %d charged, consumers %v", rt.count(), h.ledger.InUse(), cons.running(key))
	}
	if _, ok := h.mgr.Resident(key); ok {
		t.Fatal("still registered")
	}
	if err := h.mgr.Release(ctx, key); !errors.Is(err, ErrNotResident) {
		t.Fatalf("release after surrender: %v", err)
	}
}

// TestReleaseAbortsWhenHaltTimesOut: a handler that outlives the release
// bound makes the halt fail; the release aborts and consumption resumes
// once the handler is done.
func TestReleaseAbortsWhenHaltTimesOut(t *testing.T) {
	env := newBus(t)
	cp := newControlPlane(t, env, SystemClock{}, 2*time.Second, 5*time.Second)
	ctx := testCtx(t)
	key := Key{tenant, "slow"}
	durable := newMemDurable()
	durable.seed(key, compatA)
	release := make(chan struct{})
	inHand := make(chan struct{})
	var inHandOnce sync.Once
	handled := make(chan string, 4)
	h := newHost(t, hostConfig{
		id: "host-h", cp: cp, env: env, durable: durable, runtime: newFakeRuntime(), target: fakeTarget(),
		handler: func(_ context.Context, w Work) error {
			if w.MsgID == "slow" {
				inHandOnce.Do(func() { close(inHand) })
				<-release
			}
			handled <- w.MsgID
			return nil
		},
		releaseBound: 200 * time.Millisecond,
	})
	if _, err := h.mgr.Attach(ctx, request(key, ModeResume)); err != nil {
		t.Fatal(err)
	}
	if err := publishWork(ctx, env.js, key, "slow"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-inHand:
	case <-time.After(10 * time.Second):
		t.Fatal("the slow message was not handed to the handler")
	}
	err := h.mgr.Release(ctx, key)
	if !errors.Is(err, ErrReleaseAborted) {
		t.Fatalf("release: %v; want aborted", err)
	}
	if r, ok := h.mgr.Resident(key); !ok || r.Phase != PhaseResident {
		t.Fatalf("%+v %v", r, ok)
	}
	close(release)
	if err := publishWork(ctx, env.js, key, "next"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"slow", "next"} {
		select {
		case got := <-handled:
			if got != want {
				t.Fatalf("handled %s, want %s", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s not handled: consumption did not resume", want)
		}
	}
	if err := h.mgr.Release(ctx, key); err != nil {
		t.Fatal(err)
	}
}
