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
// in the tombstone, refuses to resurrect a tombstoned epoch, and a stale
// holder cannot tombstone its successor.
func TestKVLocationsFence(t *testing.T) {
	env := newBus(t)
	clock := newFakeClock()
	cp := newControlPlane(t, env, clock, time.Second, 0)
	ctx := testCtx(t)
	key := Key{tenant, "loc-1"}
	obs := func(host string, e ResidencyEpoch, s ObservedState) Observation {
		return Observation{Tenant: key.Tenant, Session: key.Session, Host: host, Epoch: e, State: s, ObservedAt: clock.Now()}
	}
	if err := cp.locations.PublishResidency(ctx, obs("a", 2, StateResident)); err != nil {
		t.Fatal(err)
	}
	if err := cp.locations.PublishResidency(ctx, obs("z", 1, StateResident)); !errors.Is(err, ErrEpochSuperseded) {
		t.Fatalf("lower epoch: %v", err)
	}
	if err := cp.locations.TombstoneResidency(ctx, key, "z", 1); !errors.Is(err, ErrEpochSuperseded) {
		t.Fatalf("stale tombstone: %v", err)
	}
	if err := cp.locations.PublishResidency(ctx, obs("z", 2, StateResident)); !errors.Is(err, ErrEpochSuperseded) {
		t.Fatalf("same epoch, other host: %v", err)
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
	if err := cp.locations.PublishResidency(ctx, obs("b", 3, StateAttaching)); err != nil {
		t.Fatal(err)
	}
	// The lease moving past an epoch fences it before the successor
	// publishes anything.
	g, err := cp.leases.AcquireSessionLease(ctx, key, "c")
	if err != nil {
		t.Fatal(err)
	}
	if g.Epoch != 1 {
		t.Fatalf("epoch %d", g.Epoch)
	}
	clock.Advance(2 * time.Second)
	for range 4 {
		g, err = cp.leases.AcquireSessionLease(ctx, key, "c")
		if err != nil {
			t.Fatal(err)
		}
		clock.Advance(2 * time.Second)
	}
	if g.Epoch != 5 {
		t.Fatalf("epoch %d, want 5", g.Epoch)
	}
	if err := cp.locations.PublishResidency(ctx, obs("b", 4, StateResident)); !errors.Is(err, ErrEpochSuperseded) {
		t.Fatalf("publish under an epoch the lease moved past: %v", err)
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
