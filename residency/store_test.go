package residency

import (
	"errors"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/bus"
)

// TestKVLeases walks wf_leases through the rules in doc.go ("Leases and
// epochs"): absent → Create at epoch 1; live → held; expired → epoch+1; a
// stale holder's renew and release are refused; release keeps the epoch;
// nothing is deleted.
func TestKVLeases(t *testing.T) {
	env := newBus(t)
	clock := newFakeClock()
	cp := newControlPlane(t, env, clock, time.Second, 0)
	ctx := testCtx(t)
	key := Key{tenant, "lease-1"}

	a1, err := cp.leases.AcquireSessionLease(ctx, key, "a")
	if err != nil || a1.Epoch != 1 {
		t.Fatalf("first acquire: %+v %v", a1, err)
	}
	if _, err := env.js.Consumer(ctx, bus.StreamInbox, bus.InboxConsumer(key.Tenant, key.Session)); err != nil {
		t.Fatalf("the grant did not create the inbox consumer: %v", err)
	}
	if _, err := cp.leases.AcquireSessionLease(ctx, key, "b"); !errors.Is(err, ErrLeaseHeld) {
		t.Fatalf("acquire of a live lease: %v, want ErrLeaseHeld", err)
	}
	clock.Advance(500 * time.Millisecond)
	a1, err = cp.leases.RenewSessionLease(ctx, a1)
	if err != nil {
		t.Fatalf("renew: %v", err)
	}
	clock.Advance(700 * time.Millisecond) // past the first expiry, inside the renewed one
	if _, err := cp.leases.AcquireSessionLease(ctx, key, "b"); !errors.Is(err, ErrLeaseHeld) {
		t.Fatalf("renewal did not extend the lease: %v", err)
	}
	clock.Advance(400 * time.Millisecond)
	if _, err := cp.leases.RenewSessionLease(ctx, a1); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("renew after expiry: %v, want ErrLeaseLost", err)
	}
	b2, err := cp.leases.AcquireSessionLease(ctx, key, "b")
	if err != nil || b2.Epoch != 2 {
		t.Fatalf("acquire after expiry: %+v %v", b2, err)
	}
	if err := cp.leases.ReleaseSessionLease(ctx, a1); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("stale release: %v, want ErrLeaseLost", err)
	}
	if err := cp.leases.ReleaseSessionLease(ctx, b2); err != nil {
		t.Fatal(err)
	}
	rec, _, err := cp.leases.Get(ctx, key)
	if err != nil || rec.Live(clock.Now()) || rec.Epoch != 2 || !rec.Released {
		t.Fatalf("released record %+v %v: want expired, epoch 2 kept", rec, err)
	}
	if _, err := cp.leases.RenewSessionLease(ctx, b2); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("renew after release: %v", err)
	}
	a3, err := cp.leases.AcquireSessionLease(ctx, key, "a")
	if err != nil || a3.Epoch != 3 {
		t.Fatalf("acquire after release: %+v %v, want epoch 3", a3, err)
	}
}

// TestKVLeasesLostAnswer: a renewal that landed but whose answer the holder
// never saw (cancelled or timed out in flight) leaves the holder a grant at a
// stale revision. Its next renewal and its release must still succeed — the
// token says the record is its own — or a drained session's lease would stay
// live until it expired. A different grant of the same key stays refused.
func TestKVLeasesLostAnswer(t *testing.T) {
	env := newBus(t)
	clock := newFakeClock()
	cp := newControlPlane(t, env, clock, time.Second, 0)
	ctx := testCtx(t)
	key := Key{tenant, "lease-lost-answer"}

	g, err := cp.leases.AcquireSessionLease(ctx, key, "a")
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(300 * time.Millisecond)
	if _, err := cp.leases.RenewSessionLease(ctx, g); err != nil { // the answer is "lost"
		t.Fatal(err)
	}
	clock.Advance(300 * time.Millisecond)
	g2, err := cp.leases.RenewSessionLease(ctx, g)
	if err != nil || g2.Revision <= g.Revision+1 {
		t.Fatalf("renewal after a lost answer: %+v %v", g2, err)
	}
	if _, err := cp.leases.RenewSessionLease(ctx, g); err != nil { // lost again
		t.Fatal(err)
	}
	if err := cp.leases.ReleaseSessionLease(ctx, g2); err != nil {
		t.Fatalf("release after a lost answer: %v", err)
	}
	rec, _, err := cp.leases.Get(ctx, key)
	if err != nil || rec.Live(clock.Now()) || !rec.Released || rec.Epoch != 1 {
		t.Fatalf("record after release %+v %v: want released at epoch 1", rec, err)
	}
	// Released means gone: the same grant cannot renew it back to life.
	if _, err := cp.leases.RenewSessionLease(ctx, g2); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("renew after release: %v, want ErrLeaseLost", err)
	}
	// A second release of the released grant is refused, not repeated.
	if err := cp.leases.ReleaseSessionLease(ctx, g); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("second release: %v, want ErrLeaseLost", err)
	}
	// The next holder's epoch-2 grant shares holder "a" but not the token.
	g3, err := cp.leases.AcquireSessionLease(ctx, key, "a")
	if err != nil || g3.Epoch != 2 {
		t.Fatalf("reacquire: %+v %v", g3, err)
	}
	if err := cp.leases.ReleaseSessionLease(ctx, g2); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("epoch-1 release over epoch 2: %v, want ErrLeaseLost", err)
	}
	if rec, _, _ := cp.leases.Get(ctx, key); !rec.Live(clock.Now()) || rec.Token != g3.Token {
		t.Fatalf("epoch-1 release touched epoch 2: %+v", rec)
	}
}

// TestKVLocationsFence: wf_residency refuses lower epochs, keeps the epoch
// in the tombstone, refuses to resurrect a tombstoned epoch, a stale holder
// cannot tombstone its successor, and only the lease's holder at exactly its
// epoch writes at all.
func TestKVLocationsFence(t *testing.T) {
	env := newBus(t)
	clock := newFakeClock()
	cp := newControlPlane(t, env, clock, time.Second, 0)
	ctx := testCtx(t)
	key := Key{tenant, "loc-1"}
	obs := func(host string, e ResidencyEpoch, s ObservedState) Observation {
		return Observation{Tenant: key.Tenant, Session: key.Session, Host: host, Epoch: e, State: s, ObservedAt: clock.Now()}
	}
	// grant gives host the lease at the next epoch, the last one having expired.
	grant := func(host string) LeaseGrant {
		t.Helper()
		clock.Advance(2 * time.Second)
		g, err := cp.leases.AcquireSessionLease(ctx, key, host)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	if err := cp.locations.PublishResidency(ctx, obs("a", 1, StateResident)); !errors.Is(err, ErrNotLeaseHolder) {
		t.Fatalf("publish with no lease: %v, want ErrNotLeaseHolder", err)
	}
	grant("z")
	if g := grant("a"); g.Epoch != 2 {
		t.Fatalf("epoch %d, want 2", g.Epoch)
	}
	if err := cp.locations.PublishResidency(ctx, obs("a", 2, StateResident)); err != nil {
		t.Fatal(err)
	}
	if err := cp.locations.PublishResidency(ctx, obs("z", 1, StateResident)); !errors.Is(err, ErrEpochSuperseded) || errors.Is(err, ErrNotLeaseHolder) {
		t.Fatalf("lower epoch: %v", err)
	}
	if err := cp.locations.TombstoneResidency(ctx, key, "z", 1); !errors.Is(err, ErrEpochSuperseded) {
		t.Fatalf("stale tombstone: %v", err)
	}
	if err := cp.locations.PublishResidency(ctx, obs("z", 2, StateResident)); !errors.Is(err, ErrNotLeaseHolder) {
		t.Fatalf("same epoch, other host: %v", err)
	}
	// A higher epoch than the lease's is no takeover.
	for _, e := range []ResidencyEpoch{3, 1 << 62} {
		if err := cp.locations.PublishResidency(ctx, obs("z", e, StateResident)); !errors.Is(err, ErrNotLeaseHolder) {
			t.Fatalf("publish at epoch %d above the lease's: %v", e, err)
		}
		if err := cp.locations.TombstoneResidency(ctx, key, "z", e); !errors.Is(err, ErrNotLeaseHolder) {
			t.Fatalf("tombstone at epoch %d above the lease's: %v", e, err)
		}
	}
	if got, _, err := cp.locations.Get(ctx, key); err != nil || got.Host != "a" || got.Epoch != 2 || got.State != StateResident {
		t.Fatalf("refused writes changed the route: %+v %v", got, err)
	}
	for range 2 { // idempotent
		if err := cp.locations.TombstoneResidency(ctx, key, "a", 2); err != nil {
			t.Fatal(err)
		}
	}
	got, _, err := cp.locations.Get(ctx, key)
	if err != nil || got.State != StateExpired || got.Epoch != 2 {
		t.Fatalf("tombstone %+v %v", got, err)
	}
	if err := cp.locations.PublishResidency(ctx, obs("a", 2, StateResident)); !errors.Is(err, ErrTombstoned) {
		t.Fatalf("publish over own tombstone: %v", err)
	}
	grant("b")
	if err := cp.locations.PublishResidency(ctx, obs("b", 3, StateAttaching)); err != nil {
		t.Fatal(err)
	}
	// The lease moving past an epoch fences it before the successor
	// publishes anything.
	for range 2 {
		grant("c")
	}
	if g := grant("c"); g.Epoch != 6 {
		t.Fatalf("epoch %d, want 6", g.Epoch)
	}
	if err := cp.locations.PublishResidency(ctx, obs("b", 3, StateResident)); !errors.Is(err, ErrEpochSuperseded) {
		t.Fatalf("publish under an epoch the lease moved past: %v", err)
	}
}

// TestKVSessionsCheckpointHolder: a checkpoint is committed only by the
// lease's holder at exactly its epoch; an epoch above the lease's, another
// host or no lease at all is refused and leaves the record as it was.
func TestKVSessionsCheckpointHolder(t *testing.T) {
	env := newBus(t)
	clock := newFakeClock()
	cp := newControlPlane(t, env, clock, time.Second, 0)
	ctx := testCtx(t)
	durable, err := NewKVSessions(ctx, KVSessionsOptions{JS: env.js, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	key := Key{tenant, "cp-1"}
	ckpt := func(host string, e ResidencyEpoch, seq uint64) Checkpoint {
		return Checkpoint{Key: WireKey(key), Host: host, Epoch: e, Sequence: seq, Namespace: NamespaceFor(key), CompatibilityID: "c1"}
	}
	if err := durable.CommitCheckpoint(ctx, ckpt("a", 1, 1)); !errors.Is(err, ErrNotLeaseHolder) {
		t.Fatalf("checkpoint with no lease: %v", err)
	}
	g, err := cp.leases.AcquireSessionLease(ctx, key, "a")
	if err != nil {
		t.Fatal(err)
	}
	if err := durable.CommitCheckpoint(ctx, ckpt("a", g.Epoch, 1)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []Checkpoint{ckpt("z", g.Epoch, 9), ckpt("z", 1<<62, 9), ckpt("a", g.Epoch+1, 9)} {
		if err := durable.CommitCheckpoint(ctx, c); !errors.Is(err, ErrNotLeaseHolder) {
			t.Fatalf("checkpoint by %s at epoch %d: %v, want ErrNotLeaseHolder", c.Host, c.Epoch, err)
		}
	}
	rec, _, err := durable.Get(ctx, key)
	if err != nil || rec.Host != "a" || rec.Epoch != g.Epoch || rec.CheckpointSequence != 1 {
		t.Fatalf("refused checkpoints changed the record: %+v %v", rec, err)
	}
}

// TestKVLeasesForgedGrant: a renewal or release is of the grant the lease
// holds, token included; the revision, epoch and holder a caller sends prove
// nothing, and a forged grant leaves the lease as it was.
func TestKVLeasesForgedGrant(t *testing.T) {
	env := newBus(t)
	clock := newFakeClock()
	cp := newControlPlane(t, env, clock, 10*time.Second, 0)
	ctx := testCtx(t)
	key := Key{tenant, "forge-1"}
	g, err := cp.leases.AcquireSessionLease(ctx, key, "a")
	if err != nil {
		t.Fatal(err)
	}
	forged := []LeaseGrant{}
	for _, mut := range []func(*LeaseGrant){
		func(f *LeaseGrant) { f.Holder, f.Token = "z", "guess" },
		func(f *LeaseGrant) { f.Holder, f.Epoch, f.Token = "z", 1<<62, "guess" },
		func(f *LeaseGrant) { f.Token = "guess" },
		func(f *LeaseGrant) { f.Holder = "z" },
		func(f *LeaseGrant) { f.Epoch++ },
	} {
		f := g
		mut(&f)
		forged = append(forged, f)
	}
	for _, f := range forged {
		if _, err := cp.leases.RenewSessionLease(ctx, f); !errors.Is(err, ErrNotLeaseHolder) {
			t.Errorf("renew of %s epoch %d: %v, want ErrNotLeaseHolder", f.Holder, f.Epoch, err)
		}
		if err := cp.leases.ReleaseSessionLease(ctx, f); !errors.Is(err, ErrNotLeaseHolder) {
			t.Errorf("release of %s epoch %d: %v, want ErrNotLeaseHolder", f.Holder, f.Epoch, err)
		}
	}
	rec, rev, err := cp.leases.Get(ctx, key)
	if err != nil || rec.Holder != "a" || rec.Epoch != g.Epoch || rec.Released || rev != g.Revision {
		t.Fatalf("forged grants moved the lease: %+v rev %d (was %d), %v", rec, rev, g.Revision, err)
	}
	if _, err := cp.leases.RenewSessionLease(ctx, g); err != nil {
		t.Fatalf("the holder's own renewal: %v", err)
	}
}

// A repeated acquire under the same token (its first answer lost) gets the
// grant it made back; any other acquire is refused while it lives.
func TestKVLeases_AcquireTokenIdempotent(t *testing.T) {
	cp := newControlPlane(t, newBus(t), SystemClock{}, 2*time.Second, 5*time.Second)
	ctx := testCtx(t)
	key := Key{Tenant: tenant, Session: "idem-1"}
	g1, err := cp.leases.AcquireSessionLeaseToken(ctx, key, "host-a", "tok-1")
	if err != nil {
		t.Fatal(err)
	}
	g2, err := cp.leases.AcquireSessionLeaseToken(ctx, key, "host-a", "tok-1")
	if err != nil || g2.Epoch != g1.Epoch || g2.Revision != g1.Revision || g2.Token != "tok-1" {
		t.Fatalf("repeat: %+v, %v; want %+v", g2, err, g1)
	}
	if _, err := cp.leases.AcquireSessionLeaseToken(ctx, key, "host-a", "tok-2"); !errors.Is(err, ErrLeaseHeld) {
		t.Fatalf("other token: %v, want ErrLeaseHeld", err)
	}
	if _, err := cp.leases.AcquireSessionLeaseToken(ctx, key, "host-b", "tok-1"); !errors.Is(err, ErrLeaseHeld) {
		t.Fatalf("other holder, same token: %v, want ErrLeaseHeld", err)
	}
	if err := cp.leases.ReleaseSessionLease(ctx, g1); err != nil {
		t.Fatal(err)
	}
	g3, err := cp.leases.AcquireSessionLeaseToken(ctx, key, "host-a", "tok-1")
	if err != nil || g3.Epoch != 2 {
		t.Fatalf("after release, same token: %+v, %v; want a new grant at epoch 2", g3, err)
	}
}
