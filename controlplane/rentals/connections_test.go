package rentals

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/adapters/capacity/fake"
	"github.com/warmfleet/warmfleet/controlplane/placement"
	"github.com/warmfleet/warmfleet/schemas"
)

func fakeConn(t *testing.T, id string, max int, reject bool, offers ...capacity.Offer) Connection {
	t.Helper()
	p, err := fake.New(fake.Config{Offers: offers, RejectCredentials: reject})
	if err != nil {
		t.Fatal(err)
	}
	return Connection{ID: id, Provider: p, MaxRentals: max}
}

// TestConnections: offers are listed from every connection that verified
// and compared across them; a connection at its own limit is left out
// (saying so), and one whose check failed is never listed and is shown
// failed; connections are named once each.
func TestConnections(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	a := offer("a-x1", "east", 500_000, false, 0)
	b := offer("b-x1", "east", 900_000, false, 0)
	cfg := Config{Connections: []Connection{
		fakeConn(t, "a", 1, false, a), fakeConn(t, "b", 0, false, b), fakeConn(t, "down", 0, true, offer("down-x1", "east", 1, false, 0)),
	}}
	cfg.Defaults()
	conns, err := newConnections(cfg.Connections)
	if err != nil {
		t.Fatal(err)
	}
	m := &Manager{cfg: cfg, conns: conns, now: func() time.Time { return now }}
	m.market = &market{cfg: &m.cfg, placement: placement.DefaultConfig(), conns: conns, now: m.now, log: zap.NewNop()}
	r := schemas.Run{ID: "r", Request: schemas.RunRequest{Resources: schemas.Resources{GPUCount: 1}, MaxRuntimeSeconds: 3600}}
	offers, err := m.market.offersFor(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, o := range offers {
		ids = append(ids, o.conn.ID+"/"+o.ID)
	}
	if strings.Join(ids, ",") != "a/a-x1,b/b-x1" {
		t.Fatalf("offers %v: want a's and b's, none of the failed connection's", ids)
	}
	if got := m.market.choose(nil, r, offers, 1e9); got.offer == nil || got.offer.conn.ID != "a" {
		t.Fatalf("with no rentals: %+v, want a's cheaper offer", got)
	}
	onA := []schemas.Rental{{RentalID: "rt-a", ConnectionID: "a", State: schemas.RentalReady}}
	got := m.market.choose(onA, r, offers, 1e9)
	if got.offer == nil || got.offer.conn.ID != "b" || !strings.Contains(got.why, "connection a is at its limit of 1") {
		t.Fatalf("a at its limit: %+v, want b's offer and why", got)
	}
	onBoth := append(onA, schemas.Rental{RentalID: "rt-b", ConnectionID: "b", State: schemas.RentalReady})
	m.conns.byID["b"].MaxRentals = 1
	if got := m.market.choose(onBoth, r, offers, 1e9); got.offer != nil || !got.limited {
		t.Fatalf("both at their limits: %+v, want nothing, limited", got)
	}
	st := map[string]schemas.ConnectionStatus{}
	m.store = newStore(nil, m.now)
	for _, s := range m.Connections() {
		st[s.ID] = s
	}
	if s := st["down"]; s.State != schemas.ConnectionFailed || s.Error == "" || s.Type != "fake" {
		t.Errorf("down: %+v", s)
	}
	if s := st["a"]; s.State != schemas.ConnectionOK || s.MaxRentals != 1 || !s.VerifiedAt.Equal(now) {
		t.Errorf("a: %+v", s)
	}
	if _, err := newConnections([]Connection{cfg.Connections[0], cfg.Connections[0]}); err == nil {
		t.Error("a connection named twice was accepted")
	}
	if err := (Config{}).Validate(); err == nil {
		t.Error("a config with no connection was accepted")
	}
}
