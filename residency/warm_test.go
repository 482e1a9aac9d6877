package residency

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

type confirmFunc func(Key) bool

func (f confirmFunc) ConfirmIdle(k Key) bool { return f(k) }

// TestManager_WarmReleaseAndResume (library level; the end-to-end
// acceptance test is e2e.TestAcceptance_WarmReleaseAndResume): a created session stays resident
// while work keeps arriving (each wake cancels the countdown); once durably
// idle for the TTL it is released — unless ConfirmIdle says otherwise at
// expiry, or the runtime refuses to release, which aborts back to resident
// under the same generation. The release checkpoints, tombstones at the
// kept epoch and drops the lease; a second host then resumes the session
// at epoch 2 and gets the work published meanwhile.
func TestManager_WarmReleaseAndResume(t *testing.T) {
	start := time.Now()
	env := newBus(t)
	ct := newContainerd(t)
	const (
		ttl     = 3 * time.Second // a lease a loaded containerd launch fits in
		warmTTL = 300 * time.Millisecond
	)
	cp := newControlPlane(t, env, SystemClock{}, ttl, 3*time.Second)
	ctx := testCtx(t)
	key := Key{tenant, "warm"}
	durable := newMemDurable()
	rlog := watchResidency(t, env)
	rec := &recorder{}
	outcomes := make(chan WarmOutcome, 16)
	var idleOK atomic.Bool
	idleOK.Store(true)
	a := newHost(t, hostConfig{
		id: "host-a", cp: cp, env: env, durable: durable, runtime: ct.rt, target: ct.target,
		handler: rec.handler("host-a"), warmTTL: warmTTL,
		confirm: confirmFunc(func(Key) bool { return idleOK.Load() }),
		hooks:   Hooks{OnWarmRelease: func(o WarmOutcome) { outcomes <- o }},
	})
	b := newHost(t, hostConfig{id: "host-b", cp: cp, env: env, durable: durable, runtime: ct.rt, target: ct.target, handler: rec.handler("host-b")})
	nextOutcome := func(within time.Duration) WarmOutcome {
		t.Helper()
		select {
		case o := <-outcomes:
			return o
		case <-time.After(within):
			t.Fatalf("no warm outcome within %v", within)
			return WarmOutcome{}
		}
	}
	var ids []string
	publish := func() {
		t.Helper()
		id := fmt.Sprintf("m-%03d", len(ids))
		if err := publishWork(ctx, env.js, key, id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}

	r, err := a.mgr.Attach(ctx, request(key, ModeCreate))
	if err != nil || !r.Attached || r.Epoch != 1 {
		t.Fatalf("create on A: %+v %v", r, err)
	}

	// Work every 100 ms for 1.2 s: four times the warm TTL, and no release.
	for range 12 {
		publish()
		time.Sleep(100 * time.Millisecond)
		select {
		case o := <-outcomes:
			t.Fatalf("warm outcome while work kept arriving: %+v", o)
		default:
		}
	}
	waitFor(t, "work handled", 30*time.Second, func() bool { return len(rec.snapshot()) == len(ids) })

	// Idle, but something the inbox cannot see is still busy.
	idleOK.Store(false)
	if o := nextOutcome(30 * time.Second); o.Kind != WarmNotIdle {
		t.Fatalf("outcome %+v, want not_idle", o)
	}
	// Idle, and the runtime refuses to go: back to resident, same generation.
	a.faults.inject("runtime.stop")
	idleOK.Store(true)
	for {
		o := nextOutcome(30 * time.Second)
		if o.Kind == WarmNotIdle {
			continue
		}
		if o.Kind != WarmAborted || !errors.Is(o.Err, ErrReleaseAborted) || o.Generation != r.Generation {
			t.Fatalf("outcome %+v, want aborted in generation %d", o, r.Generation)
		}
		break
	}
	a.faults.clear()
	if res, ok := a.mgr.Resident(key); !ok || res.Phase != PhaseResident || res.Generation != r.Generation || res.Epoch != 1 {
		t.Fatalf("after abort: %+v %v", res, ok)
	}
	obs, _, err := cp.locations.Get(ctx, key)
	if err != nil || obs.State != StateResident || !obs.Accepting || obs.Epoch != 1 {
		t.Fatalf("route after abort %+v %v", obs, err)
	}
	publish() // consumption resumed
	waitFor(t, "work after abort", 30*time.Second, func() bool { return len(rec.snapshot()) == len(ids) })

	// Now it goes.
	released := time.Now()
	for {
		o := nextOutcome(30 * time.Second)
		if o.Kind == WarmReleased {
			break
		}
		if o.Kind != WarmNotIdle {
			t.Fatalf("outcome %+v", o)
		}
	}
	t.Logf("warm release %v after the last work", time.Since(released))
	if got := held(t, cp, a, key, func() []string { return ct.workloads(t) }); len(got) != 0 {
		t.Fatalf("held after warm release: %v", got)
	}
	lrec, _, err := cp.leases.Get(ctx, key)
	if err != nil || !lrec.Released || lrec.Epoch != 1 {
		t.Fatalf("lease after release %+v %v: want released, epoch 1 kept", lrec, err)
	}
	obs, _, err = cp.locations.Get(ctx, key)
	if err != nil || obs.State != StateExpired || obs.Epoch != 1 {
		t.Fatalf("route after release %+v %v: want a tombstone at epoch 1", obs, err)
	}
	// The aborted release had checkpointed too: that is a save, not a loss.
	cps := durable.checkpoints()
	if len(cps) != 2 || cps[1].Epoch != 1 || cps[1].Sequence != 2 || cps[1].CompatibilityID != compatA {
		t.Fatalf("checkpoints %+v; want sequences 1 and 2 under epoch 1", cps)
	}

	// Work that arrives while nobody is resident waits in the inbox.
	publish()
	publish()
	rb, err := b.mgr.Attach(ctx, request(key, ModeResume))
	if err != nil || !rb.Attached || rb.Epoch != 2 {
		t.Fatalf("resume on B: %+v %v", rb, err)
	}
	waitFor(t, "B handling the waiting work", 30*time.Second, func() bool { return len(rec.snapshot()) == len(ids) })
	if err := rec.checkOnce(ids); err != nil {
		t.Fatal(err)
	}
	for _, h := range rec.snapshot()[len(ids)-2:] {
		if h.host != "host-b" || h.epoch != 2 {
			t.Fatalf("%+v; want B at epoch 2", h)
		}
	}
	if err := b.mgr.Release(ctx, key); err != nil {
		t.Fatal(err)
	}
	if err := rlog.check(key); err != nil {
		t.Fatal(err)
	}
	t.Logf("total %v", time.Since(start))
}
