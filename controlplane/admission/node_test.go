package admission

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestCallout_ResumedRentalSession: with NATS auth on, a node whose
// session expired may log in with it only while its stopped rental is being
// resumed, and then only to enroll; otherwise the expired session is
// refused as before.
func TestCallout_ResumedRentalSession(t *testing.T) {
	conn := testenv.ProvisionedBus(t, "auth-test")
	log := zaptest.NewLogger(t)
	ctx := context.Background()
	issuer, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := issuer.Seed()
	a, err := New(ctx, conn, Config{IssuerSeed: seed}, log)
	if err != nil {
		t.Fatal(err)
	}
	session := newToken()
	nodes, _ := conn.JS.KeyValue(ctx, bus.BucketNodes)
	rentals, _ := conn.JS.KeyValue(ctx, bus.BucketRentals)
	rec := schemas.NodeRecord{NodeID: "rt-1", RentalID: "rt-1", Generation: 1, FencingToken: 1, SessionTokenHash: schemas.TokenHash(session),
		SessionExpires: time.Now().Add(-time.Hour), State: schemas.NodeLost}
	if _, err := bus.CreateJSON(ctx, nodes, rec.NodeID, &rec); err != nil {
		t.Fatal(err)
	}
	rt := schemas.Rental{RentalID: "rt-1", NodeID: "rt-1", Generation: 1, State: schemas.RentalStopped, OwnershipToken: "wf"}
	rev, err := bus.CreateJSON(ctx, rentals, rt.RentalID, &rt)
	if err != nil {
		t.Fatal(err)
	}
	login := func() (grant, error) {
		return a.authorize(ctx, jwt.ConnectOptions{Username: "rt-1", Password: session})
	}
	var refusal *Refusal
	if _, err := login(); !errors.As(err, &refusal) {
		t.Fatalf("expired session of a stopped rental: %v, want a refusal", err)
	}
	rt.Generation, rt.State = 2, schemas.RentalBooting
	b, _ := codec.Encode(codec.JSON, rt)
	if _, err := rentals.Update(ctx, rt.RentalID, b, rev); err != nil {
		t.Fatal(err)
	}
	g, err := login()
	if err != nil || g.kind != "enrolling" || g.name != "rt-1" || !g.expires.After(time.Now()) {
		t.Fatalf("expired session of a resuming rental: %+v %v, want an enrolling grant", g, err)
	}
	if g, err := a.authorize(ctx, jwt.ConnectOptions{Username: "rt-2", Password: session}); err == nil {
		t.Fatalf("another node with this session: %+v", g)
	}
}
