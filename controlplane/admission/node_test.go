package admission

import (
	"context"
	"errors"
	"strings"
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

// TestCallout_EnrollingInbox: an invitation's login may read replies only
// on its own token's inbox branch, never the node's, so a fresh invitation
// for an enrolled node reads none of that node's credential replies; the
// node's session covers the inbox its agent kept from its bootstrap.
func TestCallout_EnrollingInbox(t *testing.T) {
	conn := testenv.ProvisionedBus(t, "auth-inbox-test")
	ctx := context.Background()
	issuer, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := issuer.Seed()
	a, err := New(ctx, conn, Config{IssuerSeed: seed}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	nodes, _ := conn.JS.KeyValue(ctx, bus.BucketNodes)
	enroll, _ := conn.JS.KeyValue(ctx, bus.BucketEnroll)
	session := newToken()
	rec := schemas.NodeRecord{NodeID: "n1", Generation: 1, FencingToken: 1, SessionTokenHash: schemas.TokenHash(session),
		SessionExpires: time.Now().Add(time.Hour), LeaseExpires: time.Now().Add(time.Hour), State: schemas.NodeReady}
	if _, err := bus.CreateJSON(ctx, nodes, rec.NodeID, &rec); err != nil {
		t.Fatal(err)
	}
	reinvite := newToken()
	if _, err := bus.CreateJSON(ctx, enroll, schemas.InvitationKey(reinvite), schemas.Invitation{NodeID: "n1", Generation: 2, CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	g, err := a.authorize(ctx, jwt.ConnectOptions{Username: "n1", Password: reinvite})
	if err != nil || g.kind != "enrolling" {
		t.Fatalf("the re-invitation's login: %+v %v", g, err)
	}
	own := bus.EnrollingInboxPrefix("n1", reinvite)
	if len(g.perms.Subscribe) != 1 || g.perms.Subscribe[0] != own+".>" {
		t.Fatalf("enrolling login may subscribe %v, want only %s.>", g.perms.Subscribe, own)
	}
	for _, theirs := range []string{bus.NodeInboxPrefix("n1") + ".x.1", bus.EnrollingInboxPrefix("n1", newToken()) + ".x.1"} {
		for _, s := range g.perms.Subscribe {
			if subjectMatches(s, theirs) {
				t.Errorf("enrolling login's %s covers the node's inbox %s", s, theirs)
			}
		}
	}
	g, err = a.authorize(ctx, jwt.ConnectOptions{Username: "n1", Password: session})
	if err != nil || g.kind != "node" {
		t.Fatalf("the session's login: %+v %v", g, err)
	}
	for _, in := range []string{bus.NodeInboxPrefix("n1") + ".x.1", bus.EnrollingInboxPrefix("n1", newToken()) + ".x.1"} {
		covered := false
		for _, s := range g.perms.Subscribe {
			covered = covered || subjectMatches(s, in)
		}
		if !covered {
			t.Errorf("the node's session may not subscribe its own inbox %s: %v", in, g.perms.Subscribe)
		}
	}
}

// subjectMatches reports whether a subscription pattern (with * and a
// trailing >) matches subject.
func subjectMatches(pattern, subject string) bool {
	p, s := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, tok := range p {
		switch {
		case tok == ">":
			return len(s) > i
		case i >= len(s):
			return false
		case tok != "*" && tok != s[i]:
			return false
		}
	}
	return len(p) == len(s)
}
