package lane

import (
	"context"
	"math"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/adapters/capacity/ephemeral"
	"github.com/warmfleet/warmfleet/adapters/capacity/ephemeral/fakeexec"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestBeats: the lane takes a Run only when it starts it sooner, by the
// margin, than the best node and than a rental.
func TestBeats(t *testing.T) {
	inf := math.Inf(1)
	for _, c := range []struct {
		name         string
		rental       time.Duration
		ready, start float64
		want         bool
	}{
		{"no node, no rentals", 0, 2, inf, true},
		{"a node starts it at once", 0, 2, 0, false},
		{"a node pulling a big image", 0, 2, 120, true},
		{"within the margin of the node", 0, 2, 6, false},
		{"a rental is sooner", 30 * time.Second, 60, inf, false},
		{"sooner than the rental", 3 * time.Minute, 20, inf, true},
	} {
		m := &Manager{cfg: Config{RentalReady: c.rental}}
		m.cfg.defaults()
		if got := m.beats(c.ready, c.start); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// TestLaneIneligible: a Run goes to the lane only when it allows it and
// needs nothing a node provides.
func TestLaneIneligible(t *testing.T) {
	for _, c := range []struct {
		name string
		req  schemas.RunRequest
		ok   bool
	}{
		{"allowed", schemas.RunRequest{Ephemeral: true}, true},
		{"not allowed", schemas.RunRequest{}, false},
		{"secrets", schemas.RunRequest{Ephemeral: true, SecretEnv: []schemas.SecretEnvRef{{Name: "K", Secret: "s"}}}, false},
		{"caches", schemas.RunRequest{Ephemeral: true, Caches: []schemas.CacheMount{{Name: "c", Path: "/c"}}}, false},
		{"host network", schemas.RunRequest{Ephemeral: true, Network: "host"}, false},
	} {
		if why := c.req.LaneIneligible(); (why == "") != c.ok {
			t.Errorf("%s: %q", c.name, why)
		}
	}
}

// listing counts an executor's offer listings.
type listing struct {
	*fakeexec.Executor
	n int
}

func (l *listing) ListOffers(ctx context.Context, q ephemeral.OfferQuery) ([]ephemeral.Offer, error) {
	l.n++
	return l.Executor.ListOffers(ctx, q)
}

// TestTakeAsksNoProviderWhenANodeStartsAtOnce: when a node would start the
// Run at once no lane offer can win, so no provider is asked; otherwise
// every connection is.
func TestTakeAsksNoProviderWhenANodeStartsAtOnce(t *testing.T) {
	ex := &listing{Executor: fakeexec.New(fakeexec.Config{})}
	m, err := New(Config{Connections: []Connection{{ID: "pool", Executor: ex}}}, nil, nil, nil, time.Now, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	run := schemas.Run{ID: "r1", Request: schemas.RunRequest{Ephemeral: true}}
	if took, err := m.Take(context.Background(), run, schemas.BookingDecision{}, 0); took || err != nil || ex.n != 0 {
		t.Fatalf("a node starting it at once: took %v, err %v, %d listings; want none", took, err, ex.n)
	}
	if took, err := m.Take(context.Background(), run, schemas.BookingDecision{}, math.Inf(1)); took || err != nil || ex.n != 1 {
		t.Fatalf("no node: took %v, err %v, %d listings; want one listing and no offer taken", took, err, ex.n)
	}
}

// TestFailedConnectionSkipped: a connection whose check fails is shown
// failed and never asked for offers; the one that passes is, and both are
// shown as lane connections.
func TestFailedConnectionSkipped(t *testing.T) {
	down := &listing{Executor: fakeexec.New(fakeexec.Config{RejectCredentials: true})}
	up := &listing{Executor: fakeexec.New(fakeexec.Config{})}
	m, err := New(Config{Connections: []Connection{{ID: "down", Executor: down}, {ID: "up", Executor: up}}}, nil, nil, nil, time.Now, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range m.Connections() {
		if st.State != schemas.ConnectionPending || !st.Lane || st.Type != fakeexec.Type {
			t.Fatalf("before any check: %+v", st)
		}
	}
	run := schemas.Run{ID: "r1", Request: schemas.RunRequest{Ephemeral: true}}
	if _, ok := m.best(context.Background(), run); ok || down.n != 0 || up.n != 1 {
		t.Fatalf("listings: failed connection %d, passing %d; want 0 and 1", down.n, up.n)
	}
	got := map[string]schemas.ConnectionStatus{}
	for _, st := range m.Connections() {
		got[st.ID] = st
	}
	if d := got["down"]; d.State != schemas.ConnectionFailed || d.Error == "" || d.VerifiedAt.IsZero() {
		t.Errorf("failed connection shown as %+v", d)
	}
	if u := got["up"]; u.State != schemas.ConnectionOK || u.Error != "" {
		t.Errorf("passing connection shown as %+v", u)
	}
}
