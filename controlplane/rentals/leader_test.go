package rentals

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRentalLeader_OneLeaderAndFailover: of two replicas exactly one leads
// the rental loop; when it stops cleanly the other takes over at once, and
// when it stops renewing without a word (a crash) the other takes over once
// the lease expires, never before; the term only grows.
func TestRentalLeader_OneLeaderAndFailover(t *testing.T) {
	conn := testenv.ProvisionedBus(t, "leader-test")
	log := zaptest.NewLogger(t)
	ctx := context.Background()
	const ttl = 1500 * time.Millisecond
	a, err := openLeaderLease(ctx, conn, ttl, log.Named("a"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := openLeaderLease(ctx, conn, ttl, log.Named("b"))
	if err != nil {
		t.Fatal(err)
	}
	actx, stopA := context.WithCancel(ctx)
	aDone := make(chan struct{})
	go func() { defer close(aDone); a.run(actx) }()
	waitFor(t, 5*time.Second, "a to lead", a.leading)
	bctx, stopB := context.WithCancel(ctx)
	bDone := make(chan struct{})
	go func() { defer close(bDone); b.run(bctx) }()
	defer func() { stopB(); <-bDone }()
	// Both running for over a TTL: a keeps renewing, b never leads.
	for end := time.Now().Add(2 * ttl); time.Now().Before(end); time.Sleep(25 * time.Millisecond) {
		if b.leading() || !a.leading() {
			t.Fatalf("leading: a %v b %v", a.leading(), b.leading())
		}
	}
	term := func() uint64 {
		e, err := a.kv.Get(ctx, LeaderKey)
		if err != nil {
			t.Fatal(err)
		}
		var r schemas.RentalLeader
		if err := codec.Decode(codec.JSON, e.Value(), &r); err != nil {
			t.Fatal(err)
		}
		return r.Term
	}
	t1 := term()
	stopA()
	<-aDone
	released := time.Now()
	waitFor(t, ttl, "b to lead after a released", b.leading)
	if took := time.Since(released); took > ttl {
		t.Fatalf("takeover after a clean stop took %s", took)
	}
	if t2 := term(); t2 <= t1 {
		t.Fatalf("term %d after %d", t2, t1)
	}

	// A crash: c takes over from b without b releasing. b's renewals stop
	// (its steps are no longer run) and c may lead only after expiry.
	stopB()
	<-bDone
	b2, err := openLeaderLease(ctx, conn, ttl, log.Named("b2"))
	if err != nil {
		t.Fatal(err)
	}
	if err := b2.step(ctx); err != nil || !b2.leading() {
		t.Fatalf("b2 did not take the released lease: %v", err)
	}
	crashed := time.Now()
	c, err := openLeaderLease(ctx, conn, ttl, log.Named("c"))
	if err != nil {
		t.Fatal(err)
	}
	for !c.leading() {
		if err := c.step(ctx); err != nil {
			t.Logf("c step: %v", err)
		}
		if c.leading() && time.Since(crashed) < ttl-100*time.Millisecond {
			t.Fatalf("c led %s after the crash, before the lease expired", time.Since(crashed))
		}
		if time.Since(crashed) > 3*ttl {
			t.Fatal("c never took over an expired lease")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The crashed holder, renewing late, learns it lost.
	if err := b2.step(ctx); err == nil && b2.leading() {
		t.Fatal("a superseded holder still leads after renewing")
	}
	if b2.leading() {
		t.Fatal("b2 leads beside c")
	}
}
