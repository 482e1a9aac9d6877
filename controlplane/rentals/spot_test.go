package rentals

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/adapters/capacity/fake"
	"github.com/warmfleet/warmfleet/controlplane/connhealth"
	"github.com/warmfleet/warmfleet/controlplane/placement"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestRentalStateOf_Interruption: an interruption moves a rental once;
// after it, only the machine's end moves it (it never sticks at
// interrupted, which held a rental slot for ever).
func TestRentalStateOf_Interruption(t *testing.T) {
	obs := func(s capacity.State, interrupted bool) capacity.Observation {
		return capacity.Observation{State: s, Interrupted: interrupted}
	}
	for _, c := range []struct {
		cur  schemas.RentalState
		obs  capacity.Observation
		want schemas.RentalState
	}{
		{schemas.RentalReady, obs(capacity.StateRunning, true), schemas.RentalInterrupted},
		{schemas.RentalEnrolling, obs(capacity.StateTerminated, true), schemas.RentalInterrupted},
		{schemas.RentalInterrupted, obs(capacity.StateTerminated, true), schemas.RentalTerminated},
		{schemas.RentalInterrupted, obs(capacity.StateTerminating, true), schemas.RentalTerminating},
		{schemas.RentalInterrupted, obs(capacity.StateStopped, true), ""},
		{schemas.RentalInterrupted, obs(capacity.StateRunning, false), ""},
		{schemas.RentalTerminating, obs(capacity.StateTerminated, true), schemas.RentalTerminated},
		{schemas.RentalStopped, obs(capacity.StateTerminated, true), schemas.RentalTerminated},
	} {
		if got := rentalStateOf(c.cur, c.obs); got != c.want {
			t.Errorf("%s + %+v: got %q, want %q", c.cur, c.obs, got, c.want)
		}
		if c.want != "" {
			if err := checkRentalTransition(c.cur, c.want); err != nil {
				t.Errorf("%s → %s is not in the table: %v", c.cur, c.want, err)
			}
		}
	}
}

func spotManager(t *testing.T, now time.Time) *Manager {
	p, err := fake.New(fake.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{ConnectionID: "c1", Provider: p}
	cfg.Defaults()
	conns, err := newConnections(cfg.Connections)
	if err != nil {
		t.Fatal(err)
	}
	conns.verify(context.Background(), connhealth.Every, now, zap.NewNop())
	m := &Manager{cfg: cfg, conns: conns}
	m.market = &market{cfg: &m.cfg, placement: placement.DefaultConfig(), conns: conns, now: func() time.Time { return now }, log: zap.NewNop()}
	return m
}

func offer(id, region string, micros int64, spot bool, rate float64) capacity.Offer {
	return capacity.Offer{ID: id, Region: region, GPUModel: "A100", GPUCount: 1, Available: true, Interruptible: spot, InterruptionRate: rate,
		PricePerHour: capacity.Price{Currency: "USD", MicrosPerHour: micros}}
}

// TestChooseSpot: spot and on-demand offers are weighed on expected cost
// (the interruption chance inflating spot's), the sooner start breaking a
// tie; a pool interrupted lately is left out for SpotPenalty, and the
// choice says why.
func TestChooseSpot(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	m := spotManager(t, now)
	hour := schemas.Run{ID: "r", Spot: schemas.SpotAllowed, Request: schemas.RunRequest{MaxRuntimeSeconds: 3600}}
	day := hour
	day.Request.MaxRuntimeSeconds = 24 * 3600
	od := offer("od", "east", 2_000_000, false, 0)
	cheap := offer("spot-east", "east", 700_000, true, 0.05)
	flaky := offer("spot-flaky", "east", 700_000, true, 0.5)
	west := offer("spot-west", "west", 900_000, true, 0.05)
	interrupted := schemas.Rental{RentalID: "rt-1", ConnectionID: "c1", Region: "east", GPUModel: "A100", Interruptible: true, State: schemas.RentalTerminated,
		Stages: []schemas.RentalStage{{State: schemas.RentalReady, At: now.Add(-time.Hour)}, {State: schemas.RentalInterrupted, At: now.Add(-10 * time.Minute)}}}
	old := interrupted
	old.Stages = []schemas.RentalStage{{State: schemas.RentalInterrupted, At: now.Add(-2 * time.Hour)}}
	otherConn := interrupted
	otherConn.ConnectionID = "c2"
	for _, c := range []struct {
		name    string
		run     schemas.Run
		rentals []schemas.Rental
		offers  []capacity.Offer
		want    string
		why     []string
	}{
		{"spot is cheaper for an hour", hour, nil, []capacity.Offer{od, cheap}, "spot-east", []string{"spot offer spot-east", "on-demand alternative on-demand offer od"}},
		{"a flaky pool costs more than on-demand over a day", day, nil, []capacity.Offer{od, flaky}, "od", []string{"spot alternative spot offer spot-flaky"}},
		{"the interrupted pool is left out: on-demand falls back", hour, []schemas.Rental{interrupted}, []capacity.Offer{od, cheap}, "od", []string{"spot offer spot-east left out", "rt-1"}},
		{"another region's pool still serves", hour, []schemas.Rental{interrupted}, []capacity.Offer{od, cheap, west}, "spot-west", []string{"left out"}},
		{"the penalty lapses", hour, []schemas.Rental{old}, []capacity.Offer{od, cheap}, "spot-east", nil},
		{"another connection's interruption is its own", hour, []schemas.Rental{otherConn}, []capacity.Offer{od, cheap}, "spot-east", nil},
		{"spot only waits rather than fall back", schemas.Run{ID: "r", Spot: schemas.SpotOnly}, []schemas.Rental{interrupted}, []capacity.Offer{cheap}, "", nil},
	} {
		var offers []offered
		for _, o := range c.offers {
			if policyAllows(c.run.Spot, o.Interruptible) {
				offers = append(offers, offered{conn: m.conns.order[0], Offer: o})
			}
		}
		got := m.market.choose(c.rentals, c.run, offers, 1e9)
		id := ""
		if got.offer != nil {
			id = got.offer.ID
		}
		if id != c.want {
			t.Errorf("%s: chose %q (%s), want %q", c.name, id, got.why, c.want)
			continue
		}
		for _, w := range c.why {
			if !strings.Contains(got.why, w) {
				t.Errorf("%s: why %q lacks %q", c.name, got.why, w)
			}
		}
	}
}

func TestPolicyAllows(t *testing.T) {
	for _, c := range []struct {
		p              schemas.SpotPolicy
		spot, onDemand bool
	}{
		{schemas.SpotDefault, false, true}, {schemas.SpotNever, false, true}, {schemas.SpotAllowed, true, true}, {schemas.SpotOnly, true, false},
	} {
		if policyAllows(c.p, true) != c.spot || policyAllows(c.p, false) != c.onDemand {
			t.Errorf("policy %q: spot %v on-demand %v", c.p, policyAllows(c.p, true), policyAllows(c.p, false))
		}
	}
}
