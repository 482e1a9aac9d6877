package residency

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestManager_ResidencyFailover (library level; the end-to-end acceptance
// test is e2e.TestAcceptance_ResidencyFailover): a session is resident on host A; A is
// partitioned from the control plane (its renewals and publishes stop
// reaching the stores, nothing is released); its lease expires; host B
// attaches under epoch 2; A's requests still in flight land late and are
// refused; every inbox message published throughout is handled exactly
// once, by whichever host held the grant, and the two hosts never consume
// at the same time.
func TestManager_ResidencyFailover(t *testing.T) {
	start := time.Now()
	env := newBus(t)
	ct := newContainerd(t)
	t.Logf("nats + containerd ready in %v", time.Since(start))
	// Long enough for a containerd launch on a loaded machine to fit inside
	// one lease before the first renewal.
	const ttl = 3 * time.Second
	cp := newControlPlane(t, env, SystemClock{}, ttl, 3*time.Second)
	ctx := testCtx(t)
	key := Key{tenant, "failover"}
	durable := newMemDurable()
	durable.seed(key, compatA)
	rlog := watchResidency(t, env)
	cons := newConsumption()
	rec := &recorder{}
	lostA := make(chan LostResidency, 1)

	mk := func(id string, hooks Hooks) *host {
		hooks.OnConsume = cons.hook(id)
		return newHost(t, hostConfig{id: id, cp: cp, env: env, durable: durable, runtime: ct.rt, target: ct.target, handler: rec.handler(id), hooks: hooks})
	}
	a := mk("host-a", Hooks{OnLost: func(l LostResidency) { lostA <- l }})
	b := mk("host-b", Hooks{})

	ra, err := a.mgr.Attach(ctx, request(key, ModeResume))
	if err != nil {
		t.Fatalf("attach on A: %v", err)
	}
	if !ra.Attached || ra.Epoch != 1 {
		t.Fatalf("A: %+v", ra)
	}
	again, err := a.mgr.Attach(ctx, request(key, ModeResume))
	if err != nil || again.Attached || again.Epoch != 1 || a.ledger.InUse() != 1 {
		t.Fatalf("re-attach of a resident session: %+v %v (in use %d); want Attached false, nothing taken", again, err, a.ledger.InUse())
	}
	fenceA := a.mgr.sessions[key].fenceOf()

	// Work arrives throughout.
	var (
		pubMu sync.Mutex
		ids   []string
	)
	stop := make(chan struct{})
	var stopOnce sync.Once
	stopPub := func() { stopOnce.Do(func() { close(stop) }) }
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			// Not cancelled by stop: a publish the stream took must be
			// counted, or its handling would look like a stray.
			id := fmt.Sprintf("w-%04d", i)
			if err := publishWork(ctx, env.js, key, id); err != nil {
				t.Errorf("publish %s: %v", id, err)
				return
			}
			pubMu.Lock()
			ids = append(ids, id)
			pubMu.Unlock()
		}
	}()
	defer func() { stopPub(); <-pubDone }()
	waitFor(t, "A handling work", 30*time.Second, func() bool { return len(rec.snapshot()) >= 5 })

	// Partition A from the control plane. Its heartbeat keeps trying.
	partitionedAt := time.Now()
	a.link.partition()
	var lost LostResidency
	select {
	case lost = <-lostA:
	case <-time.After(30 * time.Second):
		t.Fatal("A never noticed it lost its grant")
	}
	t.Logf("A surrendered %v after the partition: %v", time.Since(partitionedAt), lost.Reason)
	if running := cons.running(key); len(running) != 0 {
		t.Fatalf("A still consuming after surrender: %v", running)
	}
	if _, ok := a.ledger.Charged(key); ok {
		t.Fatal("A's admission charge not credited after surrender")
	}

	// B attaches once the lease has expired; until then it is refused and
	// takes nothing.
	var rb Residency
	refusals := 0
	for {
		rb, err = b.mgr.Attach(ctx, request(key, ModeResume))
		var ae *AttachError
		if errors.As(err, &ae) && ae.Code == CodeLeaseHeld {
			if !ae.TookNothing() || b.ledger.InUse() != 0 {
				t.Fatalf("lease-held refusal took something: %v", ae)
			}
			refusals++
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatalf("attach on B: %v", err)
		}
		break
	}
	if !rb.Attached || rb.Epoch != 2 || rb.Host != "host-b" {
		t.Fatalf("B: %+v", rb)
	}
	t.Logf("B resident at epoch %d, %v after the partition (%d lease-held refusals first)", rb.Epoch, time.Since(partitionedAt), refusals)

	// Let B take work, then stop producing.
	base := len(rec.snapshot())
	waitFor(t, "B handling work", 30*time.Second, func() bool { return len(rec.snapshot()) >= base+5 })
	stopPub()
	<-pubDone

	// A's requests that were in flight now land, late. Every one is refused.
	late := a.link.heal(ctx)
	if len(late) == 0 {
		t.Fatal("no request of A was in flight during the partition")
	}
	kinds := map[string]int{}
	for _, l := range late {
		kinds[l.op]++
		switch {
		case l.op == "renew" && errors.Is(l.err, ErrLeaseLost):
		case (l.op == "tombstone" || l.op == "publish.resident") && errors.Is(l.err, ErrEpochSuperseded):
		default:
			t.Errorf("late %s from A: %v; want refused", l.op, l.err)
		}
	}
	t.Logf("late requests of A, all refused: %v", kinds)
	if kinds["publish.resident"] == 0 || kinds["renew"] == 0 {
		t.Errorf("expected late renewals and publishes from A, got %v", kinds)
	}
	// The same, sent now: A's grant cannot write over B's.
	stale := Observation{Tenant: key.Tenant, Session: key.Session, Host: "host-a", Epoch: 1, State: StateResident, Accepting: true}
	if err := cp.locations.PublishResidency(ctx, stale); !errors.Is(err, ErrEpochSuperseded) {
		t.Errorf("A's late publish: %v, want ErrEpochSuperseded", err)
	}
	if err := cp.locations.TombstoneResidency(ctx, key, "host-a", 1); !errors.Is(err, ErrEpochSuperseded) {
		t.Errorf("A's late tombstone: %v, want ErrEpochSuperseded", err)
	}
	if err := fenceA.publish(ctx, StateResident); !errors.Is(err, ErrStaleEpoch) {
		t.Errorf("A's own fence published: %v, want ErrStaleEpoch", err)
	}
	obs, _, err := cp.locations.Get(ctx, key)
	if err != nil || obs.Host != "host-b" || obs.Epoch != 2 || obs.State != StateResident || !obs.Accepting {
		t.Fatalf("route %+v %v; want B resident at epoch 2", obs, err)
	}

	// Every message handled exactly once, by the grant's holder, in turn.
	pubMu.Lock()
	all := slices.Clone(ids)
	pubMu.Unlock()
	waitFor(t, "every message handled", time.Minute, func() bool { return len(rec.snapshot()) >= len(all) })
	time.Sleep(100 * time.Millisecond) // a duplicate would show up now
	if err := rec.checkOnce(all); err != nil {
		t.Fatal(err)
	}
	byHost := map[string]int{}
	for _, h := range rec.snapshot() {
		byHost[h.host]++
		if want := map[string]ResidencyEpoch{"host-a": 1, "host-b": 2}[h.host]; h.epoch != want {
			t.Errorf("%s handled %s under epoch %d", h.host, h.id, h.epoch)
		}
	}
	t.Logf("%d messages: %v", len(all), byHost)
	if err := cons.check(); err != nil {
		t.Fatal(err)
	}
	if err := rlog.check(key); err != nil {
		t.Fatal(err)
	}
	if ws := ct.workloads(t); !slices.Equal(ws, []string{WorkloadID(key, 2)}) {
		t.Fatalf("workloads %v; want only B's", ws)
	}

	rep, err := b.mgr.Drain(ctx)
	if err != nil || len(rep.Released) != 1 {
		t.Fatalf("drain B: %+v %v", rep, err)
	}
	if err := rlog.check(key); err != nil {
		t.Fatal(err)
	}
	t.Logf("total %v", time.Since(start))
}
