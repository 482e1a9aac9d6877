package placement

import (
	"math"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/schemas"
)

// decideScenario decides a committed scenario under cfg.
func decideScenario(t *testing.T, name string, cfg Config) schemas.BookingDecision {
	t.Helper()
	s := loadScenario(t, "testdata/scenarios/"+name+".json")
	fleet, req := s.fleet(t)
	return Decide(req, fleet, scenarioNow, cfg)
}

// TestFailedNodePenalty: the penalty is what moves the retry, it is added
// to the cost, and a negative penalty turns it off.
func TestFailedNodePenalty(t *testing.T) {
	on := decideScenario(t, "retry_avoids_failed_node", DefaultConfig())
	off := DefaultConfig()
	off.FailedNodePenaltySeconds = -1
	d := decideScenario(t, "retry_avoids_failed_node", off)
	if d.Winner != "a-failed" {
		t.Fatalf("without the penalty the warm node should win, got %q", d.Winner)
	}
	plain, priced := candidate(t, d.Candidates, "a-failed"), candidate(t, on.Candidates, "a-failed")
	if plain.Components.PenaltySeconds != 0 || strings.Contains(plain.Detail, "penalised") {
		t.Errorf("penalty off: %+v %q", plain.Components, plain.Detail)
	}
	if got := priced.Cost - plain.Cost; math.Abs(got-600) > 1e-9 {
		t.Errorf("penalty adds %.3fs to the cost, want 600", got)
	}
}

// TestGPUHourPrice: 0 is the default price, a negative one prices idle
// cards at nothing (the 8-GPU Run then starts cold, 20s sooner), and the
// idle seconds scale with the price.
func TestGPUHourPrice(t *testing.T) {
	const name = "idle_gpus_send_big_run_to_warm_queue"
	zero := decideScenario(t, name, DefaultConfig())
	explicit := DefaultConfig()
	explicit.GPUHourPrice = DefaultGPUHourPrice
	def := decideScenario(t, name, explicit)
	if a, b := candidate(t, zero.Candidates, "b-cold-idle").Components.IdleGPUSeconds, candidate(t, def.Candidates, "b-cold-idle").Components.IdleGPUSeconds; a != b || a <= 0 {
		t.Errorf("price 0 gives %.3f idle seconds, the default price %.3f", a, b)
	}
	free := DefaultConfig()
	free.GPUHourPrice = -1
	if d := decideScenario(t, name, free); d.Winner != "b-cold-idle" || d.WinnerQueued {
		t.Errorf("idle cards free: winner %q queued %v, want the cold idle node now", d.Winner, d.WinnerQueued)
	}
	double := DefaultConfig()
	double.GPUHourPrice = 2 * DefaultGPUHourPrice
	got := candidate(t, decideScenario(t, name, double).Candidates, "b-cold-idle").Components.IdleGPUSeconds
	if want := 2 * candidate(t, def.Candidates, "b-cold-idle").Components.IdleGPUSeconds; math.Abs(got-want) > 1e-9 {
		t.Errorf("twice the price: %.3f idle seconds, want %.3f", got, want)
	}
}

// TestIdleGPUSecondsOnlyBeyondQueue: a queued booking prefetches while it
// waits, so only the fetch that outlasts its queue holds idle cards.
func TestIdleGPUSecondsOnlyBeyondQueue(t *testing.T) {
	s := loadScenario(t, "testdata/scenarios/idle_gpus_send_big_run_to_warm_queue.json")
	// No node holds the image now (it is priced at UnknownImageBytes):
	// a's pull fits inside its 100s queue; b is busy too, freeing in 5s,
	// and its pull outlasts that.
	s.Nodes[0].Images = nil
	s.Nodes[1].Running = []scenarioBooking{{Resources: s.Nodes[0].Running[0].Resources, EndsIn: 5}}
	fleet, req := s.fleet(t)
	d := Decide(req, fleet, scenarioNow, DefaultConfig())
	rate := idleGPURate(&Config{SecondsPerDollarHour: DefaultConfig().SecondsPerDollarHour}, 8)
	if got := candidate(t, d.Candidates, "a-warm-busy").Components.IdleGPUSeconds; got != 0 {
		t.Errorf("pull within the queue: %.3f idle seconds, want 0", got)
	}
	b := candidate(t, d.Candidates, "b-cold-idle").Components
	if want := (b.PullSeconds - 5) * rate; b.PullSeconds <= 5 || math.Abs(b.IdleGPUSeconds-want) > 1e-6 {
		t.Errorf("%.1fs of pull behind a 5s queue: %.3f idle seconds, want %.3f", b.PullSeconds, b.IdleGPUSeconds, want)
	}
}
