package bus_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/internal/testenv"
)

// testLease is a lease record as a user of bus.Lease would define it.
type testLease struct {
	Holder    string    `json:"holder"`
	Epoch     uint64    `json:"epoch"`
	ExpiresAt time.Time `json:"expires_at"`
}

func (r testLease) LeaseEpoch() uint64        { return r.Epoch }
func (r testLease) LeaseExpiresAt() time.Time { return r.ExpiresAt }

func TestTakeoverEpoch(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, c := range []struct {
		name   string
		cur    testLease
		rev    uint64
		epoch  uint64
		wantOK bool
	}{
		{"absent", testLease{}, 0, 1, true},
		{"live", testLease{Epoch: 4, ExpiresAt: now.Add(time.Nanosecond)}, 7, 0, false},
		{"expires now", testLease{Epoch: 4, ExpiresAt: now}, 7, 5, true},
		{"expired", testLease{Epoch: 4, ExpiresAt: now.Add(-time.Second)}, 7, 5, true},
	} {
		epoch, ok := bus.TakeoverEpoch(c.cur, c.rev, now)
		if epoch != c.epoch || ok != c.wantOK {
			t.Errorf("%s: TakeoverEpoch = %d, %v; want %d, %v", c.name, epoch, ok, c.epoch, c.wantOK)
		}
	}
}

func leaseBucket(t *testing.T) (context.Context, jetstream.KeyValue) {
	t.Helper()
	n := testenv.StartNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	conn := testenv.Dial(t, n.URL(), "lease-test")
	kv, err := conn.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "leases"})
	if err != nil {
		t.Fatal(err)
	}
	return ctx, kv
}

// TestLeaseRules walks one key through the wf_leases rules: absent →
// epoch 1; live → held (or the holder's own, unwritten); renew at the own
// revision; a lost renewal answer still renews; expired → epoch+1; a stale
// holder's write is lost; release keeps the epoch; nothing is deleted.
func TestLeaseRules(t *testing.T) {
	ctx, kv := leaseBucket(t)
	l := bus.Lease[testLease]{KV: kv, Key: "tenant.session"}
	const ttl = time.Second
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	mk := func(holder string) func(uint64, time.Time) testLease {
		return func(epoch uint64, at time.Time) testLease {
			return testLease{Holder: holder, Epoch: epoch, ExpiresAt: at.Add(ttl)}
		}
	}
	ownedBy := func(holder string) func(testLease) bool {
		return func(r testLease) bool { return r.Holder == holder }
	}

	if _, rev, err := l.Read(ctx); err != nil || rev != 0 {
		t.Fatalf("absent key: rev %d, %v", rev, err)
	}
	a, arev, err := l.Acquire(ctx, clock, mk("a"), ownedBy("a"))
	if err != nil || a.Epoch != 1 || a.Holder != "a" || arev == 0 {
		t.Fatalf("first acquire: %+v rev %d %v", a, arev, err)
	}
	cur, rev, err := l.Acquire(ctx, clock, mk("b"), ownedBy("b"))
	if !errors.Is(err, bus.ErrLeaseHeld) || cur.Holder != "a" || rev != arev {
		t.Fatalf("acquire of a live lease: %+v rev %d %v, want ErrLeaseHeld naming a", cur, rev, err)
	}
	again, rev, err := l.Acquire(ctx, clock, mk("a"), ownedBy("a"))
	if err != nil || again.Holder != a.Holder || again.Epoch != a.Epoch || !again.ExpiresAt.Equal(a.ExpiresAt) || rev != arev {
		t.Fatalf("repeat acquire by its holder: %+v rev %d %v, want the stored record unwritten", again, rev, err)
	}

	// Renew at the own revision; then a renewal whose answer was lost:
	// the next renewal at the old revision rereads and lands.
	now = now.Add(300 * time.Millisecond)
	rev1, err := l.WriteOwn(ctx, mk("a")(1, now), arev, now, ownedBy("a"))
	if err != nil || rev1 <= arev {
		t.Fatalf("renew: rev %d %v", rev1, err)
	}
	now = now.Add(300 * time.Millisecond)
	rev2, err := l.WriteOwn(ctx, mk("a")(1, now), arev, now, ownedBy("a"))
	if err != nil || rev2 <= rev1 {
		t.Fatalf("renew at a stale revision of its own: rev %d %v", rev2, err)
	}
	// A stale write by another holder is lost, never retried.
	if _, err := l.WriteOwn(ctx, mk("b")(1, now), arev, now, ownedBy("b")); !errors.Is(err, bus.ErrLeaseLost) {
		t.Fatalf("write over another holder's record: %v, want ErrLeaseLost", err)
	}

	// Expired: the next holder takes it at epoch 2; the old one has lost.
	now = now.Add(2 * ttl)
	b, brev, err := l.Acquire(ctx, clock, mk("b"), ownedBy("b"))
	if err != nil || b.Epoch != 2 {
		t.Fatalf("acquire after expiry: %+v %v", b, err)
	}
	if _, err := l.WriteOwn(ctx, mk("a")(1, now), rev2, now, ownedBy("a")); !errors.Is(err, bus.ErrLeaseLost) {
		t.Fatalf("renew by the superseded holder: %v, want ErrLeaseLost", err)
	}

	// Release: an "expired now" record that keeps the epoch.
	released := testLease{Holder: "b", Epoch: b.Epoch, ExpiresAt: now}
	if _, err := l.WriteOwn(ctx, released, brev, now, ownedBy("b")); err != nil {
		t.Fatalf("release: %v", err)
	}
	cur, _, err = l.Read(ctx)
	if err != nil || cur.Epoch != 2 || bus.LeaseLive(cur, now) {
		t.Fatalf("released record %+v %v: want expired at epoch 2", cur, err)
	}
	c, _, err := l.Acquire(ctx, clock, mk("c"), ownedBy("c"))
	if err != nil || c.Epoch != 3 {
		t.Fatalf("acquire after release: %+v %v, want epoch 3", c, err)
	}
}

// TestLeaseOneWinner: holders racing for an absent, then an expired, key:
// exactly one gets each epoch.
func TestLeaseOneWinner(t *testing.T) {
	ctx, kv := leaseBucket(t)
	l := bus.Lease[testLease]{KV: kv, Key: "contended"}
	for round, now := range []time.Time{time.Unix(1000, 0), time.Unix(2000, 0)} {
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			winners []testLease
		)
		for i := range 8 {
			holder := string(rune('a' + i))
			wg.Go(func() {
				rec, _, err := l.Acquire(ctx, func() time.Time { return now },
					func(epoch uint64, at time.Time) testLease {
						return testLease{Holder: holder, Epoch: epoch, ExpiresAt: at.Add(time.Second)}
					},
					func(r testLease) bool { return r.Holder == holder })
				switch {
				case err == nil:
					mu.Lock()
					winners = append(winners, rec)
					mu.Unlock()
				case !errors.Is(err, bus.ErrLeaseHeld):
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if len(winners) != 1 || winners[0].Epoch != uint64(round+1) {
			t.Fatalf("round %d: winners %+v, want one at epoch %d", round, winners, round+1)
		}
	}
}

// TestLeaseDecode: a custom decoder is used, and a value that does not
// decode is an error, not an absent key.
func TestLeaseDecode(t *testing.T) {
	ctx, kv := leaseBucket(t)
	if _, err := kv.Put(ctx, "k", []byte(`{"holder":"a","epoch":3,"extra":true}`)); err != nil {
		t.Fatal(err)
	}
	lenient := bus.Lease[testLease]{KV: kv, Key: "k"}
	if r, rev, err := lenient.Read(ctx); err != nil || r.Epoch != 3 || rev == 0 {
		t.Fatalf("lenient read: %+v %d %v", r, rev, err)
	}
	errStrict := errors.New("strict")
	strict := bus.Lease[testLease]{KV: kv, Key: "k", Decode: func(b []byte, v any) error {
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			return err
		}
		if _, ok := m["extra"]; ok {
			return errStrict
		}
		return json.Unmarshal(b, v)
	}}
	if _, _, err := strict.Read(ctx); !errors.Is(err, errStrict) {
		t.Fatalf("strict read: %v, want the decoder's error", err)
	}
}
